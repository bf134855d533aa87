#!/usr/bin/env bash
# The Brown corpus as BERT data: data/brown_bert_sentence (.bin/.idx), BERT
# WordPiece, one sequence per sentence, which input_decks/bert-tiny.deck
# reads. tools/prepare-brown.sh with PREPARE_BROWN_DATASET=bert; the same
# arguments and environment (MESHTRON_BIN, MESHTRON_DATA_DIR, ...).
#
#   tools/prepare-brown-bert.sh                    # uses build/meshtron
#   tools/prepare-brown-bert.sh path/to/meshtron
set -euo pipefail
PREPARE_BROWN_DATASET=bert exec "$(dirname "${BASH_SOURCE[0]}")/prepare-brown.sh" "$@"
