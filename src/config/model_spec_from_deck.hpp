// The deck's [model] section as a ModelSpec: the one place where deck keys
// (Megatron-LM's flag names) become the architecture the layers read.
#pragma once

#include "config/run_config.hpp"
#include "model/model_spec.hpp"

namespace meshtron {

/// `vocab_size` is the tokenizer's (model.vocab_size, when set, wins); the
/// vocabulary is padded for tensor-parallel degree `tp`.
ModelSpec model_spec_from_deck(const RunConfig& run, int vocab_size, int tp);

/// The inverse: a [model] section that model_spec_from_deck reads back as
/// `spec` (up to the vocabulary padding and the dropouts), the architecture
/// keys written where they differ from their defaults. A UserError names
/// a part of `spec` that no deck key states.
std::string model_deck_section(const ModelSpec& spec);

}  // namespace meshtron
