#!/usr/bin/env bash
# logging.sample_interval: the sample lines of a tp 2 x pp 2 run equal those
# of one rank, and the losses of a run with samples equal those without.
#   training_samples.sh MPIEXEC MESHTRON DECK WORK
set -euo pipefail
mpiexec=$1 meshtron=$2 deck=$3 work=$4
common=(--set training.train_iters=4 --set logging.sample_tokens=8 --set checkpoint.save_dir=)
run() {  # run NP NAME SETS...
  local np=$1 name=$2; shift 2
  "$mpiexec" --oversubscribe -np "$np" "$meshtron" train "$deck" "${common[@]}" \
    --set run.output_dir="$work/$name" "$@" 2>&1
}
one=$(run 1 one --set logging.sample_interval=2)
grid=$(run 4 grid --set logging.sample_interval=2 --set parallel.tensor_parallel=2 \
           --set parallel.pipeline_parallel=2)
plain=$(run 4 plain --set logging.sample_interval=0 --set parallel.tensor_parallel=2 \
            --set parallel.pipeline_parallel=2)
samples() { grep -E '^ sample \| step' <<<"$1" || true; }
losses() { grep -oE 'loss [0-9.]+ \| grad norm [0-9.]+' <<<"$1" || true; }
[ "$(samples "$one" | wc -l)" -eq 2 ] || { echo "FAIL: expected 2 sample lines"; echo "$one"; exit 1; }
[ "$(samples "$one")" == "$(samples "$grid")" ] ||
  { echo "FAIL: samples differ between 1 rank and tp 2 x pp 2"; samples "$one"; samples "$grid"; exit 1; }
[ -n "$(losses "$plain")" ] && [ "$(losses "$grid")" == "$(losses "$plain")" ] ||
  { echo "FAIL: samples changed the losses"; losses "$grid"; losses "$plain"; exit 1; }
samples "$grid"
echo "PASS"
