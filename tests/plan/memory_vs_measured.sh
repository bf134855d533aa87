#!/usr/bin/env bash
# meshtron plan's per-rank peak tensor memory against a measured run, on CPU
# ranks: for each layout, `meshtron train` reports tensor_memory_mib in its
# metrics.jsonl (the largest rank's peak of live host-tensor bytes,
# tensor/tensor.hpp host_tensor_stats: parameters, gradients, optimizer
# state, activations and temporaries, but not the binary, MPI or libraries
# that the resident set holds), and `meshtron plan` on the same deck and
# layout prints "peak tensor memory (max over ranks)". They must agree to
# within 10 %. tiny.deck's shape covers GPT's and Llama's layers; the
# shipped bert-tiny and t5-tiny decks (synthetic data) cover BERT's and
# T5's (encoder-decoder split, cross-attention, relative position bias).
#
#   memory_vs_measured.sh MESHTRON WORKDIR MPIEXEC [FLAGS...]
set -euo pipefail
meshtron=$1 work=$2
shift 2
mpiexec=("$@")
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
# The shipped decks name their tokenizer files from the repository root.
cd "$here/../.."
# tiny.deck with activations big enough to weigh against the parameters.
tiny=(tests/train/tiny.deck --set model.seq_length=64 --set model.hidden_size=64
      --set training.micro_batch_size=4 --set training.global_batch_size=32
      --set checkpoint.save_dir= --set training.train_iters=3)
# The shipped decks on synthetic data, 3 steps.
synthetic=(--set data.source=synthetic --set checkpoint.save_dir= --set training.train_iters=3
           --set lr_schedule.warmup_iters=1 --set training.eval_interval=0)
bert=(input_decks/bert-tiny.deck "${synthetic[@]}")
t5=(input_decks/t5-tiny.deck "${synthetic[@]}")
status=0
check() {  # name np deck overrides...
  local name=$1 np=$2
  shift 2
  "${mpiexec[@]}" -np "$np" "$meshtron" train "$@" \
    --set run.output_dir="$work/$name" > "$work/$name.log" 2>&1
  local measured planned
  measured=$(tail -n 1 "$(find "$work/$name" -name metrics.jsonl | head -n 1)" |
             sed -n 's/.*"tensor_memory_mib": \([0-9.e+-]*\).*/\1/p')
  planned=$("$meshtron" plan "$@" |
            sed -n 's/^peak tensor memory (max over ranks): \([0-9.]*\) MiB/\1/p')
  if awk -v m="$measured" -v p="$planned" 'BEGIN { d = (p - m) / m; exit !(d <= 0.10 && d >= -0.10) }'; then
    echo "ok   $name: plan $planned MiB, measured $measured MiB"
  else
    echo "FAIL $name: plan $planned MiB, measured $measured MiB (more than 10 % apart)"
    status=1
  fi
}
check one_rank 1 "${tiny[@]}"
check tp2 2 "${tiny[@]}" --set parallel.tensor_parallel=2
check tp2_sp 2 "${tiny[@]}" --set parallel.tensor_parallel=2 --set parallel.sequence_parallel=true
check pp2 2 "${tiny[@]}" --set parallel.pipeline_parallel=2
check pp2_gpipe 2 "${tiny[@]}" --set parallel.pipeline_parallel=2 --set parallel.schedule=gpipe
check dp2_distributed 2 "${tiny[@]}" --set parallel.data_parallel=2 \
      --set parallel.distributed_optimizer=true
check pp2_interleaved 2 "${tiny[@]}" --set parallel.pipeline_parallel=2 \
      --set parallel.schedule=interleaved --set parallel.virtual_stages=2
# Llama's family: RMSNorm, SwiGLU (3 matrices), GQA (2 kv groups), no biases, rotary.
check llama_tp2 2 "${tiny[@]}" --set parallel.tensor_parallel=2 --set model.normalization=RMSNorm \
      --set model.activation=swiglu --set model.num_query_groups=2 --set model.add_bias_linear=false \
      --set model.position_embedding_type=rope --set model.untie_embeddings_and_output_weights=true
check selective 1 "${tiny[@]}" --set training.recompute=selective
check full 1 "${tiny[@]}" --set training.recompute=full
# BERT: the MLM and binary heads, padding mask, token types.
check bert_one_rank 1 "${bert[@]}" --set parallel.tensor_parallel=1
check bert_pp2 2 "${bert[@]}" --set parallel.tensor_parallel=1 --set parallel.pipeline_parallel=2
# T5: encoder and decoder stacks of their own lengths, pp split between them.
check t5_one_rank 1 "${t5[@]}"
check t5_tp2_sp 2 "${t5[@]}" --set parallel.tensor_parallel=2 --set parallel.sequence_parallel=true
check t5_pp2 2 "${t5[@]}" --set parallel.pipeline_parallel=2
check t5_tp2_pp2 4 "${t5[@]}" --set parallel.tensor_parallel=2 --set parallel.pipeline_parallel=2
check t5_selective 1 "${t5[@]}" --set training.recompute=selective
check t5_full 1 "${t5[@]}" --set training.recompute=full
exit $status
