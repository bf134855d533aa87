#!/usr/bin/env bash
# A model family's tiny deck end to end: 4 steps on 1 rank, on 4 ranks in the
# deck's own layout (tp 2 x dp 2 for most) and pp 2 x dp 2 give the same losses; the checkpoint goes to Hugging Face (as
# ARCHITECTURE, e.g. LlamaForCausalLM) and back bit for bit.
#   family_tiny.sh MESHTRON WORKDIR DECK ARCHITECTURE MPIEXEC [MPIEXEC ARGS...]
set -euo pipefail
meshtron=$1 work=$2 deck=$(cd "$(dirname "$3")" && pwd)/$(basename "$3") architecture=$4
shift 4
mpiexec=("$@")
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work"
small=(--set data.source=synthetic --set model.vocab_size=512 --set model.seq_length=32
       --set training.train_iters=4 --set lr_schedule.warmup_iters=1 --set training.eval_interval=0
       --set logging.log_interval=1 --set run.output_dir="$work/runs")
run() {  # NAME NP [--set ...]
  local name=$1 np=$2; shift 2
  "${mpiexec[@]}" -np "$np" "$meshtron" train "$deck" "${small[@]}" --set run.name="$name" \
      --set checkpoint.save_dir="$name" "$@" > "$name.txt"
}
run one 1 --set parallel.tensor_parallel=1
run deck_np4 4
run pp2_dp2 4 --set parallel.tensor_parallel=1 --set parallel.pipeline_parallel=2
for layout in deck_np4 pp2_dp2; do
  python3 "$here/compare_losses.py" runs/one/metrics.jsonl "runs/$layout/metrics.jsonl" 1 4 1e-5
done
"$meshtron" convert --from deck_np4/iter_0000004.h5 --to hf hf
grep -q "\"architectures\": \[ *\"$architecture\"" <(tr -d '\n' < hf/config.json)
"$meshtron" convert --from hf hf --to back
h5diff deck_np4/iter_0000004.h5 back/iter_0000000.h5 /model /model
echo "$(basename "$deck" .deck): ok"
