#!/usr/bin/env bash
# Fetch the Brown corpus and the BERT WordPiece vocabulary
# (tools/fetch-corpus.sh), then preprocess the corpus, one sequence per
# sentence (--split-sentences), into the indexed dataset
# data/brown_bert_sentence that input_decks/bert-tiny.deck reads.
#
#   tools/prepare-brown-bert.sh                    # uses build/meshtron
#   tools/prepare-brown-bert.sh path/to/meshtron   # or MESHTRON_BIN=path/to/meshtron
#   MESHTRON_DATA_DIR=/scratch/d tools/prepare-brown-bert.sh
#
# Idempotent: does nothing when data/brown_bert_sentence.idx exists (delete
# it to redo). Runs 2 MPI ranks (PREPARE_BROWN_RANKS to change) through
# mpirun (MPIEXEC to change), as tools/prepare-brown.sh. No --append-eod:
# Megatron's BERT data marks documents by the index, not by an EOD token.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
data_dir="${MESHTRON_DATA_DIR:-$repo_root/data}"
meshtron="${1:-${MESHTRON_BIN:-$repo_root/build/meshtron}}"
ranks="${PREPARE_BROWN_RANKS:-2}"
mpiexec="${MPIEXEC:-mpirun}"
prefix="$data_dir/brown_bert_sentence"

die() { echo "prepare-brown-bert: $*" >&2; exit 1; }

MESHTRON_DATA_DIR="$data_dir" "$repo_root/tools/fetch-corpus.sh"

if [[ -f "$prefix.idx" ]]; then
  echo "prepare-brown-bert: $prefix.idx already exists; nothing to do"
  exit 0
fi
[[ -x "$meshtron" ]] || die "no meshtron executable at '$meshtron' (build it, pass its path, or set MESHTRON_BIN)"
command -v "$mpiexec" >/dev/null || die "'$mpiexec' not found (set MPIEXEC)"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "prepare-brown-bert: $mpiexec -np $ranks $meshtron preprocess ... -> $prefix"
"$mpiexec" --oversubscribe -np "$ranks" "$meshtron" preprocess \
  --input "$data_dir/brown.jsonl" --json-key text --output-prefix "$prefix" \
  --tokenizer bert_wordpiece_lowercase --vocab-file "$data_dir/bert-base-uncased-vocab.txt" \
  --split-sentences --overwrite
echo "prepare-brown-bert: done; dataset at $prefix.{bin,idx}"
