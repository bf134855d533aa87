// Parameters owned by a test, with stable addresses, and the ParameterList
// of pointers the optimizers take (shared by the host and GPU optimizer tests).
#pragma once

#include <deque>

#include "model/parameter.hpp"

namespace meshtron::testing_util {

struct ParameterSet {
  std::deque<Parameter> params;  ///< a deque: growing it never moves a Parameter
  ParameterList list() {
    ParameterList out;
    for (Parameter& p : params) out.push_back(&p);
    return out;
  }
};

}  // namespace meshtron::testing_util
