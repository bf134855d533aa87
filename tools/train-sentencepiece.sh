#!/usr/bin/env bash
# Trains the small SentencePiece model of the tokenizer tests,
# validation/sentencepiece-brown/tokenizer.model, on the Brown corpus text
# (data/brown.txt from tools/fetch-corpus.sh), with the trainer settings of
# Llama 2's tokenizer.model (BPE, byte fallback, digits split, identity
# normalization, a dummy prefix, whitespace kept, <unk>=0 <s>=1 </s>=2, no
# pad) and a vocabulary of 3000 instead of 32000, so that the file stays small.
#
#   tools/train-sentencepiece.sh                 # writes validation/sentencepiece-brown/
#   MESHTRON_DATA_DIR=/scratch/d tools/train-sentencepiece.sh
#
# Needs spm_train (Debian package sentencepiece, see tools/setup.sh).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
data_dir="${MESHTRON_DATA_DIR:-$repo_root/data}"
out_dir="$repo_root/validation/sentencepiece-brown"
corpus="$data_dir/brown.txt"

command -v spm_train >/dev/null || { echo "train-sentencepiece: no spm_train (apt-get install sentencepiece)" >&2; exit 1; }
[[ -f "$corpus" ]] || { echo "train-sentencepiece: no $corpus (run tools/fetch-corpus.sh)" >&2; exit 1; }
mkdir -p "$out_dir"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# One thread, every sentence of the corpus, and relative input and output
# names (the model records both): the same file on every run and machine.
cd "$work"
ln -s "$corpus" brown.txt
spm_train --input=brown.txt --model_prefix=tokenizer \
  --model_type=bpe --vocab_size=3000 --character_coverage=0.99995 \
  --byte_fallback=true --split_digits=true --allow_whitespace_only_pieces=true \
  --normalization_rule_name=identity --add_dummy_prefix=true --remove_extra_whitespaces=false \
  --split_by_unicode_script=true --split_by_whitespace=true --max_sentence_length=4192 \
  --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=-1 \
  --input_sentence_size=0 --shuffle_input_sentence=false --num_threads=1 --minloglevel=1
mv "$work/tokenizer.model" "$out_dir/tokenizer.model"
echo "train-sentencepiece: wrote $out_dir/tokenizer.model ($(stat -c %s "$out_dir/tokenizer.model") bytes)"
