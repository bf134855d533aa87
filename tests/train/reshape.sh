#!/usr/bin/env bash
# Reshape on load: save at (tp, pp, dp) = (2, 2, 2) with the distributed
# optimizer after 3 steps; load at other layouts without it; the next 2 steps
# match the uninterrupted (2, 2, 2) run.
#   reshape.sh MESHTRON WORKDIR MPIEXEC [MPIEXEC ARGS...]
# EXTRA_DECK (optional): a further deck every run reads after tiny.deck (a
# deck, not --set: the checkpoint keeps the decks' text, which a load
# compares the model with).
# SAVE_LAYOUT, LOAD_LAYOUTS (optional): "ranks tp pp" of the saving run and
# of each loading run, for a model that does not take every layout (BERT:
# no pipeline parallelism).
set -euo pipefail
meshtron=$1 work=$2; shift 2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
run() {
  local np=$1 name=$2 tp=$3 pp=$4 distopt=$5 iters=$6 load=$7; shift 7
  "$@" -np "$np" "$meshtron" train "$here/tiny.deck" ${EXTRA_DECK:+"$EXTRA_DECK"} \
    --set training.train_iters="$iters" \
    --set lr_schedule.decay_iters=5 --set parallel.tensor_parallel="$tp" \
    --set parallel.pipeline_parallel="$pp" --set parallel.distributed_optimizer="$distopt" \
    --set run.name="$name" --set run.output_dir="$work/runs" \
    --set checkpoint.save_dir="$work/$name" --set checkpoint.load="$load"
}
read -r save_np save_tp save_pp <<<"${SAVE_LAYOUT:-8 2 2}"
run "$save_np" whole "$save_tp" "$save_pp" true 5 "" "$@"
run "$save_np" first "$save_tp" "$save_pp" true 3 "" "$@"
IFS=, read -r -a load_layouts <<<"${LOAD_LAYOUTS:-8 1 1,8 4 2,8 1 4,1 1 1}"
for layout in "${load_layouts[@]}"; do
  read -r np tp pp <<<"$layout"
  name=load_np${np}_tp${tp}_pp${pp}
  mkdir -p "$work/$name" && cp "$work/first/iter_0000003.h5" "$work/$name/" && echo "iter_0000003.h5" > "$work/$name/latest"
  run "$np" "$name" "$tp" "$pp" false 5 auto "$@"
  python3 "$here/compare_losses.py" "$work/runs/whole/metrics.jsonl" "$work/runs/$name/metrics.jsonl" 4 5 1e-5
done
echo "reshape: every layout continues the ($save_np ranks, tp $save_tp, pp $save_pp) run"
