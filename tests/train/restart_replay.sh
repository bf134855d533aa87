#!/usr/bin/env bash
# Restart replay (DESIGN.md invariant 3): 6 steps uninterrupted == 3 steps,
# save, restart from the checkpoint, 3 more steps (losses, grad norms and the
# final parameters, dropout and data order included).
#   restart_replay.sh MESHTRON WORKDIR MPIEXEC [MPIEXEC ARGS...]
# EXTRA_DECK (optional): a further deck every run reads after tiny.deck.
# PIPELINE_PARALLEL (optional, default 1): pp of the 4 ranks (tp 2 x pp x dp).
set -euo pipefail
meshtron=$1 work=$2; shift 2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
run() { "$@" "$meshtron" train "$here/tiny.deck" ${EXTRA_DECK:+"$EXTRA_DECK"} --set parallel.tensor_parallel=2 \
          --set parallel.pipeline_parallel="${PIPELINE_PARALLEL:-1}" --set run.output_dir="$work/runs" "${extra[@]}"; }
extra=(--set run.name=whole --set checkpoint.save_dir="$work/whole")
run "$@" -np 4
extra=(--set run.name=split --set checkpoint.save_dir="$work/split" --set training.train_iters=3)
run "$@" -np 4
extra=(--set run.name=split --set checkpoint.save_dir="$work/split" --set checkpoint.load=auto)
run "$@" -np 4
python3 "$here/compare_losses.py" "$work/runs/whole/metrics.jsonl" "$work/runs/split/metrics.jsonl" 1 6 1e-6
h5diff --relative=1e-6 "$work/whole/iter_0000006.h5" "$work/split/iter_0000006.h5" /model /model
echo "restart replay: identical"
