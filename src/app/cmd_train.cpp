#include "app/commands.hpp"
#include "common/error.hpp"

namespace meshtron::app {

int run_train(const std::vector<std::string>& args) {
  throw UserError("train: the trainer is not built yet");
}

}  // namespace meshtron::app
