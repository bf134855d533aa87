#!/usr/bin/env bash
# train_profile.sh MESHTRON DECK DIR: `meshtron train` on one GPU with
# logging.profile traces steps [3, 5); the step split is printed and rank 0's
# Chrome trace and kernel table are written. Skips (exit 0) without a GPU.
set -eu
meshtron=$1 deck=$2 dir=$3
if ! nvidia-smi -L >/dev/null 2>&1; then echo "no GPU: skipped"; exit 0; fi
rm -rf "$dir"
out=$("$meshtron" train "$deck" --set run.device=cuda --set logging.profile=true \
      --set logging.profile_step_start=3 --set logging.profile_step_end=5 \
      --set checkpoint.save_dir= --set run.output_dir="$dir" 2>&1)
echo "$out"
grep -Eq "GPU trace of steps \[3, 5\)" <<<"$out"
grep -Eq "rank 0: step [0-9.]+ ms: busy [0-9.]+ \(compute [0-9.]+" <<<"$out"
run=$(ls -d "$dir"/*/)
grep -q '"ph": "X"' "$run/trace_rank0.json"
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert len(d['traceEvents']) > 10" \
  "$run/trace_rank0.json"
grep -q "ms/step  calls/step  kernel" "$run/trace_rank0.txt"
echo "trace OK: $(grep -c '"ph"' "$run/trace_rank0.json") events"
