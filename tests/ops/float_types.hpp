// The fp32 / fp64 type list of the host ops' typed tests, and the names
// GoogleTest prints for it ("fp32", "fp64") instead of 0 and 1.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <type_traits>

namespace meshtron::test_types {

struct FloatTypeNames {
  template <class T>
  static std::string GetName(int) {
    return std::is_same_v<T, float> ? "fp32" : "fp64";
  }
};
using FloatTypes = ::testing::Types<float, double>;

}  // namespace meshtron::test_types
