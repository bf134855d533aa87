#!/usr/bin/env bash
# Fetch the Brown corpus and the vocabularies (tools/fetch-corpus.sh), then
# preprocess the corpus into the indexed dataset (.bin/.idx) the tiny decks
# read: with PREPARE_BROWN_DATASET=gpt2 (the default) data/brown_text_document,
# GPT-2 BPE with an EOD after each document; with =bert (what
# tools/prepare-brown-bert.sh sets) data/brown_bert_sentence, BERT WordPiece,
# one sequence per sentence (--split-sentences) and no EOD: Megatron's BERT
# data marks documents by the index, not by a token; with =t5
# data/brown_t5_sentence, the SentencePiece Brown model of
# validation/sentencepiece-brown, one sequence per sentence (<s> first, as
# Megatron's Llama2Tokenizer encodes each) for T5's span corruption.
#
#   tools/prepare-brown.sh                       # uses build/meshtron
#   tools/prepare-brown.sh path/to/meshtron      # or MESHTRON_BIN=path/to/meshtron
#   MESHTRON_DATA_DIR=/scratch/d tools/prepare-brown.sh
#
# Idempotent: does nothing when the dataset's .idx exists (delete it to
# redo). Runs 2 MPI ranks (PREPARE_BROWN_RANKS to change) through mpirun
# (MPIEXEC to change), allowed to run as root and oversubscribed, as in CI.
# The dataset is the same for any number of ranks.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
data_dir="${MESHTRON_DATA_DIR:-$repo_root/data}"
meshtron="${1:-${MESHTRON_BIN:-$repo_root/build/meshtron}}"
ranks="${PREPARE_BROWN_RANKS:-2}"
mpiexec="${MPIEXEC:-mpirun}"

die() { echo "prepare-brown: $*" >&2; exit 1; }

case "${PREPARE_BROWN_DATASET:-gpt2}" in
  gpt2)
    prefix="$data_dir/brown_text_document"
    tokenize=(--tokenizer gpt2 --vocab-file "$data_dir/encoder.json"
              --merge-file "$data_dir/vocab.bpe" --append-eod) ;;
  bert)
    prefix="$data_dir/brown_bert_sentence"
    tokenize=(--tokenizer bert_wordpiece_lowercase
              --vocab-file "$data_dir/bert-base-uncased-vocab.txt" --split-sentences) ;;
  t5)
    prefix="$data_dir/brown_t5_sentence"
    tokenize=(--tokenizer sentencepiece
              --tokenizer-model "$repo_root/validation/sentencepiece-brown/tokenizer.model"
              --split-sentences) ;;
  *) die "PREPARE_BROWN_DATASET = '$PREPARE_BROWN_DATASET' is not gpt2, bert or t5" ;;
esac

# 1. Corpus and vocabulary (each step of fetch-corpus.sh skips itself when done).
MESHTRON_DATA_DIR="$data_dir" "$repo_root/tools/fetch-corpus.sh"

# 2. The indexed dataset, unless it is already there.
if [[ -f "$prefix.idx" ]]; then
  echo "prepare-brown: $prefix.idx already exists; nothing to do"
  exit 0
fi
[[ -x "$meshtron" ]] || die "no meshtron executable at '$meshtron' (build it, pass its path, or set MESHTRON_BIN)"
command -v "$mpiexec" >/dev/null || die "'$mpiexec' not found (set MPIEXEC)"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# --overwrite: with no .idx, a .bin left by an interrupted run is not a dataset.
echo "prepare-brown: $mpiexec -np $ranks $meshtron preprocess ... -> $prefix"
"$mpiexec" --oversubscribe -np "$ranks" "$meshtron" preprocess \
  --input "$data_dir/brown.jsonl" --json-key text --output-prefix "$prefix" \
  "${tokenize[@]}" --overwrite
echo "prepare-brown: done; dataset at $prefix.{bin,idx}"
