#!/usr/bin/env bash
# meshtron plan's per-rank peak tensor memory against a measured run, on CPU
# ranks: for each layout, `meshtron train` reports tensor_memory_mib in its
# metrics.jsonl (the largest rank's peak of live host-tensor bytes,
# tensor/tensor.hpp host_tensor_stats: parameters, gradients, optimizer
# state, activations and temporaries, but not the binary, MPI or libraries
# that the resident set holds), and `meshtron plan` on the same deck and
# layout prints "peak tensor memory (max over ranks)". They must agree to
# within 10 %.
#
#   memory_vs_measured.sh MESHTRON WORKDIR MPIEXEC [FLAGS...]
set -euo pipefail
meshtron=$1 work=$2
shift 2
mpiexec=("$@")
here=$(cd "$(dirname "$0")" && pwd)
deck=$here/../train/tiny.deck
rm -rf "$work" && mkdir -p "$work"
# tiny.deck with activations big enough to weigh against the parameters.
shape=(--set model.seq_length=64 --set model.hidden_size=64 --set training.micro_batch_size=4
       --set training.global_batch_size=32 --set checkpoint.save_dir= --set training.train_iters=3)
status=0
check() {  # name np overrides...
  local name=$1 np=$2
  shift 2
  "${mpiexec[@]}" -np "$np" "$meshtron" train "$deck" "${shape[@]}" "$@" \
    --set run.output_dir="$work/$name" > "$work/$name.log" 2>&1
  local measured planned
  measured=$(tail -n 1 "$(find "$work/$name" -name metrics.jsonl | head -n 1)" |
             sed -n 's/.*"tensor_memory_mib": \([0-9.e+-]*\).*/\1/p')
  planned=$("$meshtron" plan "$deck" "${shape[@]}" "$@" |
            sed -n 's/^peak tensor memory (max over ranks): \([0-9.]*\) MiB/\1/p')
  if awk -v m="$measured" -v p="$planned" 'BEGIN { d = (p - m) / m; exit !(d <= 0.10 && d >= -0.10) }'; then
    echo "ok   $name: plan $planned MiB, measured $measured MiB"
  else
    echo "FAIL $name: plan $planned MiB, measured $measured MiB (more than 10 % apart)"
    status=1
  fi
}
check one_rank 1
check tp2 2 --set parallel.tensor_parallel=2
check tp2_sp 2 --set parallel.tensor_parallel=2 --set parallel.sequence_parallel=true
check pp2 2 --set parallel.pipeline_parallel=2
check pp2_gpipe 2 --set parallel.pipeline_parallel=2 --set parallel.schedule=gpipe
check dp2_distributed 2 --set parallel.data_parallel=2 --set parallel.distributed_optimizer=true
check pp2_interleaved 2 --set parallel.pipeline_parallel=2 --set parallel.schedule=interleaved \
      --set parallel.virtual_stages=2
# Llama's family: RMSNorm, SwiGLU (3 matrices), GQA (2 kv groups), no biases, rotary.
check llama_tp2 2 --set parallel.tensor_parallel=2 --set model.normalization=RMSNorm \
      --set model.activation=swiglu --set model.num_query_groups=2 --set model.add_bias_linear=false \
      --set model.position_embedding_type=rope --set model.untie_embeddings_and_output_weights=true
check selective 1 --set training.recompute=selective
check full 1 --set training.recompute=full
exit $status
