// Subcommands of the meshtron executable. Each takes the arguments after the
// command name and returns the process exit status; user errors throw
// meshtron::UserError on every rank alike.
#pragma once

#include <string>
#include <vector>

#include "config/run_config.hpp"

namespace meshtron::app {

/// DECK [--set k=v ...]: the deck and its overrides, parsed (not validated).
struct DeckArgs {
  std::string deck;
  std::vector<std::string> overrides;
  std::vector<std::string> rest;  ///< other flags, for the command to read
};
DeckArgs parse_deck_args(const std::vector<std::string>& args);

int run_info(const std::vector<std::string>& args);
int run_train(const std::vector<std::string>& args);
int run_preprocess(const std::vector<std::string>& args);
int run_inspect(const std::vector<std::string>& args);
int run_convert(const std::vector<std::string>& args);

}  // namespace meshtron::app
