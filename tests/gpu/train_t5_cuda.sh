#!/usr/bin/env bash
# train_t5_cuda.sh MESHTRON TRAIN_DIR WORK: `meshtron train` of a T5 (tiny.deck
# + t5.deck, synthetic T5 batches: encoder and decoder inputs, both padding
# masks, labels) on one GPU equals the host in fp32 (losses and gradient
# norms of 4 steps to 1e-4; dropout off, gpu_t5 compares the model itself),
# and a bf16 run on the GPU gives finite losses. Skips (exit 0) without a GPU.
set -euo pipefail
meshtron=$1 train=$2 work=$3
if ! nvidia-smi -L >/dev/null 2>&1; then echo "no GPU: skipped"; exit 0; fi
rm -rf "$work"
run() {  # run NAME SETS...
  local name=$1
  shift
  "$meshtron" train "$train/tiny.deck" "$train/t5.deck" --set training.train_iters=4 \
    --set checkpoint.save_dir= --set model.hidden_dropout=0 --set model.attention_dropout=0 \
    --set run.name="$name" --set run.output_dir="$work" "$@" > "$work.$name.log" 2>&1 ||
    { cat "$work.$name.log"; echo "FAIL: run $name"; exit 1; }
}
mkdir -p "$work"
run cpu
run gpu --set run.device=cuda
run bf16 --set run.device=cuda --set training.precision=bf16
python3 "$train/compare_losses.py" "$work/cpu/metrics.jsonl" "$work/gpu/metrics.jsonl" 1 4 1e-4 ||
  { echo "FAIL: fp32 on the GPU differs from the host"; exit 1; }
python3 - "$work/bf16/metrics.jsonl" <<'PY' || { echo "FAIL: bf16 losses"; exit 1; }
import json, math, sys
losses = [json.loads(l)["loss"] for l in open(sys.argv[1]) if '"loss"' in l]
print("bf16 losses:", losses)
assert len(losses) == 4 and all(math.isfinite(x) for x in losses)
PY
echo "PASS"
