#!/usr/bin/env bash
# training_samples_cuda.sh MESHTRON DECK WORK: logging.sample_interval on one
# GPU. In fp32 the sample lines equal the host's; in bf16 (CUDA graphs on)
# there are two of them and the losses equal those of a run without
# samples. Skips (exit 0) without a GPU.
set -euo pipefail
meshtron=$1 deck=$2 work=$3
if ! nvidia-smi -L >/dev/null 2>&1; then echo "no GPU: skipped"; exit 0; fi
rm -rf "$work"
common=(--set training.train_iters=4 --set logging.sample_tokens=8 --set checkpoint.save_dir=)
run() {  # run NAME SETS...: the run's output; its log and FAIL if it fails
  local name=$1 out
  shift
  if ! out=$("$meshtron" train "$deck" "${common[@]}" --set run.output_dir="$work/$name" "$@" 2>&1); then
    echo "$out" >&2
    echo "FAIL: run $name" >&2
    exit 1
  fi
  echo "$out"
}
samples() { grep -E '^ sample \| step' <<<"$1" || true; }
losses() { grep -oE 'loss [0-9.]+ \| grad norm [0-9.]+' <<<"$1" || true; }
cpu=$(run cpu --set logging.sample_interval=2) || exit 1
gpu=$(run gpu --set logging.sample_interval=2 --set run.device=cuda) || exit 1
bf16=$(run bf16 --set logging.sample_interval=2 --set run.device=cuda \
           --set training.precision=bf16 --set training.cuda_graphs=true) || exit 1
plain=$(run plain --set logging.sample_interval=0 --set run.device=cuda \
            --set training.precision=bf16 --set training.cuda_graphs=true) || exit 1
[ "$(samples "$gpu" | wc -l)" -eq 2 ] || { echo "FAIL: expected 2 sample lines"; echo "$gpu"; exit 1; }
[ "$(samples "$cpu")" == "$(samples "$gpu")" ] ||
  { echo "FAIL: fp32 samples differ between the host and the GPU"; samples "$cpu"; samples "$gpu"; exit 1; }
[ "$(samples "$bf16" | wc -l)" -eq 2 ] || { echo "FAIL: expected 2 bf16 sample lines"; echo "$bf16"; exit 1; }
[ -n "$(losses "$plain")" ] && [ "$(losses "$bf16")" == "$(losses "$plain")" ] ||
  { echo "FAIL: samples changed the bf16 losses"; losses "$bf16"; losses "$plain"; exit 1; }
samples "$gpu"
samples "$bf16"
echo "PASS"
