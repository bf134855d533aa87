#!/usr/bin/env bash
# T5 trains the same on 1 rank and on tp 2 x dp 2 (DESIGN.md invariant 1;
# there also with sequence parallelism, and with the distributed optimizer,
# overlaps and full recompute), and over Megatron's encoder | decoder
# pipeline split: pp 2 x dp 2 (1f1b), tp 2 x pp 2 (gpipe, sequence
# parallelism), pp 4 of 2 + 2 stages (the relative-bias tables' and the
# word table's copies summed over their stages; distributed optimizer with
# overlapped reduction), and pp 4 with an untied head (v1.1: the word table
# on the first encoder and decoder stages only). Losses and gradient norms
# of 4 steps to 1e-5, dropout on, on synthetic batches (tiny.deck + t5.deck)
# and, when the corpus is there (DATA_DIR/brown.jsonl), on Megatron's T5
# span-corruption samples of 40 Brown documents preprocessed with the
# SentencePiece Brown model and --split-sentences (tp 2 x dp 2 and tp 2 x
# pp 2); there also the validation losses (every 2 steps) and meshtron
# evaluate's loss of the 1-rank checkpoint on tp 2 x dp 2 and tp 2 x pp 2.
# A deck whose decoder differs from the 1-rank checkpoint, the interleaved
# schedule and an uneven split are one line each.
#   t5_decomposition.sh MESHTRON WORKDIR DATA_DIR MPIEXEC [MPIEXEC ARGS...]
set -euo pipefail
meshtron=$1 work=$2 data=$3; shift 3
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
rm -rf "$work" && mkdir -p "$work"
run() {  # run NAME RANKS TP [--set ...]
  local name=$1 ranks=$2 tp=$3; shift 3
  "${mpiexec[@]}" -np "$ranks" "$meshtron" train "$here/tiny.deck" "$here/t5.deck" \
    --set run.name="$name" --set run.output_dir="$work/runs" \
    --set parallel.tensor_parallel="$tp" --set training.train_iters=4 "$@"
}
compare() { python3 "$here/compare_losses.py" "$work/runs/$1/metrics.jsonl" "$work/runs/$2/metrics.jsonl" 1 4 1e-5; }
mpiexec=("$@")
nosave=(--set checkpoint.save_dir=)
run one 1 1 --set checkpoint.save_dir="$work/ckpt"
run grid 4 2 "${nosave[@]}"
compare one grid
run sp 4 2 "${nosave[@]}" --set parallel.sequence_parallel=true
compare one sp
run overlap 4 2 "${nosave[@]}" --set parallel.distributed_optimizer=true \
  --set parallel.overlap_grad_reduce=true --set parallel.overlap_param_gather=true \
  --set training.recompute=full
compare one overlap
run pp2 4 1 "${nosave[@]}" --set parallel.pipeline_parallel=2
compare one pp2
run tp2_pp2 4 2 "${nosave[@]}" --set parallel.pipeline_parallel=2 --set parallel.schedule=gpipe \
  --set parallel.sequence_parallel=true
compare one tp2_pp2
run pp4 4 1 "${nosave[@]}" --set parallel.pipeline_parallel=4 \
  --set parallel.distributed_optimizer=true --set parallel.overlap_grad_reduce=true
compare one pp4
v11=(--set model.activation=geglu_tanh --set model.untie_embeddings_and_output_weights=true)
run one_v11 1 1 "${nosave[@]}" "${v11[@]}"
run pp4_v11 4 1 "${nosave[@]}" "${v11[@]}" --set parallel.pipeline_parallel=4
compare one_v11 pp4_v11
# The interleaved schedule and an uneven split are one line each.
refused() {  # refused REGEX RANKS [--set ...]
  local regex=$1 ranks=$2; shift 2
  "$here/../foundation/expect_error.sh" "$regex" "${mpiexec[@]}" -np "$ranks" "$meshtron" train \
    "$here/tiny.deck" "$here/t5.deck" --set run.output_dir="$work/runs" "${nosave[@]}" "$@"
}
refused "the interleaved schedule is not built for the encoder-decoder" 2 \
  --set parallel.pipeline_parallel=2 --set parallel.schedule=interleaved \
  --set parallel.virtual_stages=2
refused "the encoder's 4 layers over 3 stages and the decoder's 4 over 1" 4 \
  --set parallel.pipeline_parallel=4 --set parallel.pipeline_split_rank=3
# A deck whose decoder differs from the checkpoint's is named, one line.
status=0
run mismatch 1 1 "${nosave[@]}" --set model.decoder_num_layers=3 \
  --set checkpoint.load="$work/ckpt/iter_0000004.h5" 2> "$work/mismatch.err" || status=$?
[[ $status != 0 ]] && grep -q "model.decoder_num_layers = 3 in the deck, 4 in the checkpoint" \
  "$work/mismatch.err" || { echo "t5 decomposition: mismatched decoder not named"; exit 1; }

if [[ -f "$data/brown.jsonl" ]]; then
  model="$repo/validation/sentencepiece-brown/tokenizer.model"
  head -n 40 "$data/brown.jsonl" > "$work/brown40.jsonl"
  "${mpiexec[@]}" -np 2 "$meshtron" preprocess --input "$work/brown40.jsonl" --json-key text \
    --output-prefix "$work/brown40" --tokenizer sentencepiece --tokenizer-model "$model" \
    --split-sentences --overwrite
  corpus=(--set data.source=indexed --set data.path="$work/brown40" --set data.split=90,10,0
          --set data.tokenizer=sentencepiece --set data.tokenizer_model="$model"
          --set model.vocab_size=0 --set model.seq_length=64 --set model.max_position_embeddings=64
          --set model.decoder_seq_length=24 --set training.eval_interval=2
          --set training.eval_iters=2)
  run one_indexed 1 1 "${corpus[@]}" --set checkpoint.save_dir="$work/ckpt_indexed"
  run grid_indexed 4 2 "${nosave[@]}" "${corpus[@]}"
  compare one_indexed grid_indexed
  run tp2_pp2_indexed 4 2 "${nosave[@]}" "${corpus[@]}" --set parallel.pipeline_parallel=2
  compare one_indexed tp2_pp2_indexed
  for layout in grid_indexed tp2_pp2_indexed; do
    python3 - "$work/runs/one_indexed/metrics.jsonl" "$work/runs/$layout/metrics.jsonl" <<'PY'
import json, sys
evals = [[json.loads(l)["eval_loss"] for l in open(p) if "eval_loss" in l] for p in sys.argv[1:]]
print("validation losses:", evals[0], "vs", evals[1])
assert len(evals[0]) == 2 and len(evals[1]) == 2, "expected 2 validation losses each"
assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(*evals)), "validation losses differ"
PY
  done
  score() {  # score RANKS TP [--set ...]: the result line of meshtron evaluate
    local ranks=$1 tp=$2; shift 2
    "${mpiexec[@]}" -np "$ranks" "$meshtron" evaluate "$here/tiny.deck" "$here/t5.deck" "${corpus[@]}" \
      --set parallel.tensor_parallel="$tp" --set checkpoint.load="$work/ckpt_indexed/iter_0000004.h5" \
      "$@" | grep "valid split | loss"
  }
  one=$(score 1 1) grid=$(score 4 2) pipeline=$(score 4 2 --set parallel.pipeline_parallel=2)
  echo "1 rank:      $one"; echo "tp 2 x dp 2: $grid"; echo "tp 2 x pp 2: $pipeline"
  [[ "$one" == "$grid" && "$one" == "$pipeline" && "$one" =~ \ [1-9][0-9]*\ labelled\ tokens ]] ||
    { echo "t5 decomposition: evaluate differs or scored no token"; exit 1; }
else
  echo "t5 decomposition: no $data/brown.jsonl: the indexed case is skipped"
fi
echo "t5 decomposition: identical"
