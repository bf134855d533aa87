#!/usr/bin/env bash
# Fine-tuning from Hugging Face and back: the golden GPT-2 converted, trained
# from its weights (fresh optimizer, iteration 0) on 1 rank, tp 2 x dp 2 and
# pp 2 x dp 2 with the same losses, and as a requeued job (pretrained, then
# its own save); exported to Hugging Face and converted back bit for bit; a
# deck whose model differs from the checkpoint's is one line naming the key.
#   finetune_hf.sh MESHTRON WORKDIR MPIEXEC [MPIEXEC ARGS...]
set -euo pipefail
meshtron=$1 work=$2; shift 2
mpiexec=("$@")
here=$(cd "$(dirname "$0")" && pwd)
golden="$here/../../validation/gpt2-golden"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }

"$meshtron" convert --from hf "$golden" --to pretrained
cat > finetune.deck <<DECK
[run]
output_dir = $work/runs
[model]
seq_length = 16
hidden_dropout = 0.1
attention_dropout = 0.1
[training]
micro_batch_size = 2
global_batch_size = 8
train_iters = 4
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
finetune pp2_dp2 4 --set parallel.pipeline_parallel=2
for layout in tp2_dp2 pp2_dp2; do
  python3 "$here/compare_losses.py" runs/one/metrics.jsonl "runs/$layout/metrics.jsonl" 1 4 1e-5
done

# A requeued fine-tuning job (checkpoint.load = auto with checkpoint.pretrained):
# the first part starts from the pretrained weights, the second resumes from
# its own save, and together they repeat the uninterrupted run.
requeued() {
  "$meshtron" train pretrained/model.deck finetune.deck --set run.name=requeued \
      --set checkpoint.save_dir=requeued --set checkpoint.load=auto \
      --set checkpoint.pretrained=pretrained/iter_0000000.h5 --set lr_schedule.decay_iters=4 "$@"
}
requeued --set training.train_iters=2 > requeued_1.txt
grep -q "fine-tuning from pretrained/iter_0000000.h5" requeued_1.txt || fail "no fine-tuning start"
requeued > requeued_2.txt
grep -q "resumed from requeued/iter_0000002.h5 at iteration 2" requeued_2.txt || fail "no resume"
python3 "$here/compare_losses.py" runs/one/metrics.jsonl runs/requeued/metrics.jsonl 1 4 1e-12

"$meshtron" convert --from tp2_dp2/iter_0000004.h5 --to hf exported
"$meshtron" convert --from hf exported --to reimported
h5diff tp2_dp2/iter_0000004.h5 reimported/iter_0000000.h5 /model /model

status=0
"$meshtron" train pretrained/model.deck finetune.deck --set model.num_attention_heads=8 \
    --set checkpoint.save_dir=mismatch > mismatch.txt 2> mismatch.err || status=$?
[[ $status == 1 ]] || fail "mismatched deck: exit status $status"
grep -q "^meshtron: error: the deck's model does not match checkpoint 'pretrained/iter_0000000.h5': model.num_attention_heads = 8 in the deck, 4 in the checkpoint" mismatch.err ||
  fail "$(cat mismatch.err)"
echo "fine-tune from Hugging Face and back: ok"
