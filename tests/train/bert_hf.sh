#!/usr/bin/env bash
# BERT to Hugging Face and back: a random BERT (tiny.deck + bert.deck, two
# steps) exported as MegatronBertForPreTraining, converted back into a
# meshtron checkpoint (the same /model tensors) and exported again (the same
# files, byte for byte); then fine-tuned from that checkpoint on 1 rank and
# tp 2 x dp 2 (the same losses) and exported once more.
# BERT_LAYOUT=google does the same with Google's layout (+ bert_google.deck:
# post-norm blocks, the embedding norm) through BertForPreTraining.
#   [BERT_LAYOUT=megatron|google] bert_hf.sh MESHTRON WORKDIR MPIEXEC [MPIEXEC ARGS...]
set -euo pipefail
meshtron=$1 work=$2; shift 2
mpiexec=("$@")
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }

case "${BERT_LAYOUT:-megatron}" in
  megatron) decks=("$here/tiny.deck" "$here/bert.deck")
            architecture=MegatronBertForPreTraining model_type=megatron-bert ;;
  google)   decks=("$here/tiny.deck" "$here/bert.deck" "$here/bert_google.deck")
            architecture=BertForPreTraining model_type=bert ;;
  *) fail "BERT_LAYOUT=$BERT_LAYOUT: expected megatron or google" ;;
esac

"$meshtron" train "${decks[@]}" --set training.train_iters=2 \
    --set run.name=random --set run.output_dir="$work/runs" --set checkpoint.save_dir=random
"$meshtron" convert --from random/iter_0000002.h5 --to hf exported
python3 -c 'import json, sys; c = json.load(open(sys.argv[1]))
sys.exit(c["architectures"] != [sys.argv[2]] or c["model_type"] != sys.argv[3])' \
    exported/config.json "$architecture" "$model_type" ||
  fail "exported/config.json is not $architecture (model_type $model_type)"
"$meshtron" convert --from hf exported --to pretrained
grep -q "^arch = bert" pretrained/model.deck || fail "model.deck does not state arch = bert"
if [[ $model_type == bert ]]; then
  grep -q "^norm_placement = post" pretrained/model.deck || fail "model.deck is not post-norm"
  grep -q "^embedding_norm = true" pretrained/model.deck || fail "model.deck has no embedding norm"
fi
h5diff random/iter_0000002.h5 pretrained/iter_0000000.h5 /model /model
"$meshtron" convert --from pretrained/iter_0000000.h5 --to hf reexported
for f in config.json model.safetensors; do cmp "exported/$f" "reexported/$f"; done

cat > finetune.deck <<DECK
[run]
output_dir = $work/runs
[model]
hidden_dropout = 0.1
attention_dropout = 0.1
[training]
micro_batch_size = 2
global_batch_size = 8
train_iters = 3
[data]
source = synthetic
[checkpoint]
load = pretrained/iter_0000000.h5
[logging]
progress = off
DECK
finetune() {  # NAME NP [--set ...]
  local name=$1 np=$2; shift 2
  "${mpiexec[@]}" -np "$np" "$meshtron" train pretrained/model.deck finetune.deck \
      --set run.name="$name" --set checkpoint.save_dir="$name" "$@" > "$name.txt"
  grep -q "fine-tuning from pretrained/iter_0000000.h5" "$name.txt" || fail "$name did not fine-tune"
}
finetune one 1
finetune tp2_dp2 4 --set parallel.tensor_parallel=2
python3 "$here/compare_losses.py" runs/one/metrics.jsonl runs/tp2_dp2/metrics.jsonl 1 3 1e-5
"$meshtron" convert --from tp2_dp2/iter_0000003.h5 --to hf finetuned
"$meshtron" convert --from hf finetuned --to refinetuned
h5diff tp2_dp2/iter_0000003.h5 refinetuned/iter_0000000.h5 /model /model
echo "BERT to Hugging Face, fine-tuned, and back: ok"
