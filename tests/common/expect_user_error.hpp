// expect_user_error(fn, {"piece", ...}): `fn` throws a meshtron::UserError
// whose message is one line holding every piece.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.hpp"

namespace meshtron::testing_util {

template <class F>
void expect_user_error(F&& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "no UserError thrown";
  } catch (const UserError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << msg;
  }
}

}  // namespace meshtron::testing_util
