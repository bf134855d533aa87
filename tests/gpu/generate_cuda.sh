#!/usr/bin/env bash
# generate_cuda.sh MPIEXEC MESHTRON DECK CHECKPOINT PROMPTS DIR: `meshtron
# generate` (greedy, fp32) on one GPU gives the host's ids, and so do tp 2
# and pp 2 (micro-batches in flight) on two GPUs where the node has them.
# Skips (exit 0) without a GPU.
set -eu
mpiexec=$1 meshtron=$2 deck=$3 ckpt=$4 prompts=$5 dir=$6
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${gpus:-0}" -lt 1 ]; then echo "no GPU: skipped"; exit 0; fi
rm -rf "$dir"
mkdir -p "$dir"

run() {  # NAME RANKS DEVICE [--set ...]
  local name=$1 np=$2 device=$3
  shift 3
  if ! "$mpiexec" -np "$np" "$meshtron" generate "$deck" --set checkpoint.load="$ckpt" \
      --set generate.prompts="$prompts" --set generate.output="$dir/$name.jsonl" \
      --set run.device="$device" --set run.output_dir="$dir/runs_$name" "$@" \
      >"$dir/$name.log" 2>&1; then
    cat "$dir/$name.log"
    echo "FAIL: $name did not run"
    exit 1
  fi
}
ids() { python3 -c 'import json, sys; print([json.loads(l)["ids"] for l in open(sys.argv[1])])' "$1"; }
same_as_host() {
  local got want
  got=$(ids "$dir/$1.jsonl")
  want=$(ids "$dir/cpu.jsonl")
  echo "$1: $got"
  if [ "$got" != "$want" ]; then echo "FAIL: $1 differs from the host: $want"; exit 1; fi
}

run cpu 1 cpu
echo "cpu: $(ids "$dir/cpu.jsonl")"
run cuda 1 cuda
same_as_host cuda
if [ "$gpus" -ge 2 ]; then
  run cuda_tp2 2 cuda --set parallel.tensor_parallel=2
  same_as_host cuda_tp2
  run cuda_pp2 2 cuda --set parallel.pipeline_parallel=2
  same_as_host cuda_pp2
fi
echo PASS
