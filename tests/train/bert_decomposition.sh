#!/usr/bin/env bash
# BERT trains the same on 1 rank and on tp 2 x dp 2 (DESIGN.md invariant 1;
# there also with the distributed optimizer, overlaps and full recompute):
# losses and gradient norms of 4 steps to 1e-5, dropout on, on synthetic
# batches (tiny.deck + bert.deck) and, when the corpus is there
# (DATA_DIR/brown.jsonl and the WordPiece vocabulary of
# tools/fetch-corpus.sh), on Megatron's BERT samples of 40 Brown documents
# preprocessed with --split-sentences (there also on tp 2 + SP x pp 2:
# Megatron's samples through the pipeline); there, meshtron evaluate's
# MLM loss and binary-head accuracy of the 1-rank checkpoint are the same on
# tp 2 x dp 2 and tp 2 x pp 2. parallel_bert_decomposition holds the 8-rank layouts of
# synthetic batches to 1e-10 in fp64.
#   bert_decomposition.sh MESHTRON WORKDIR DATA_DIR MPIEXEC [MPIEXEC ARGS...]
set -euo pipefail
meshtron=$1 work=$2 data=$3; shift 3
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
run() {  # run NAME RANKS TP [--set ...]
  local name=$1 ranks=$2 tp=$3; shift 3
  "${mpiexec[@]}" -np "$ranks" "$meshtron" train "$here/tiny.deck" "$here/bert.deck" \
    --set run.name="$name" --set run.output_dir="$work/runs" \
    --set parallel.tensor_parallel="$tp" --set training.train_iters=4 "$@"
}
compare() { python3 "$here/compare_losses.py" "$work/runs/$1/metrics.jsonl" "$work/runs/$2/metrics.jsonl" 1 4 1e-5; }
mpiexec=("$@")
run one 1 1 --set checkpoint.save_dir=
run grid 4 2 --set checkpoint.save_dir=
compare one grid
# The distributed optimizer with overlapped reduction and gathers (BertModel
# reports its gradients once its backward is over), and full recompute.
run overlap 4 2 --set checkpoint.save_dir= --set parallel.distributed_optimizer=true \
  --set parallel.overlap_grad_reduce=true --set parallel.overlap_param_gather=true \
  --set training.recompute=full
compare one overlap

vocab="$data/bert-base-uncased-vocab.txt"
if [[ -f "$data/brown.jsonl" && -f "$vocab" ]]; then
  head -n 40 "$data/brown.jsonl" > "$work/brown40.jsonl"
  "${mpiexec[@]}" -np 2 "$meshtron" preprocess --input "$work/brown40.jsonl" --json-key text \
    --output-prefix "$work/brown40" --tokenizer bert_wordpiece_lowercase --vocab-file "$vocab" \
    --split-sentences --overwrite
  corpus=(--set data.source=indexed --set data.path="$work/brown40" --set data.split=90,10,0
          --set data.tokenizer=bert_wordpiece_lowercase --set data.vocab_file="$vocab"
          --set model.vocab_size=0 --set model.seq_length=64 --set model.max_position_embeddings=64)
  run one_indexed 1 1 "${corpus[@]}" --set checkpoint.save_dir="$work/ckpt"
  run grid_indexed 4 2 "${corpus[@]}" --set checkpoint.save_dir=
  compare one_indexed grid_indexed
  run pipeline_indexed 4 2 "${corpus[@]}" --set checkpoint.save_dir= \
    --set parallel.pipeline_parallel=2 --set parallel.sequence_parallel=true
  compare one_indexed pipeline_indexed
  score() {  # score RANKS TP [--set ...]: the result line of meshtron evaluate
    local ranks=$1 tp=$2; shift 2
    "${mpiexec[@]}" -np "$ranks" "$meshtron" evaluate "$here/tiny.deck" "$here/bert.deck" "${corpus[@]}" \
      --set parallel.tensor_parallel="$tp" --set checkpoint.load="$work/ckpt/iter_0000004.h5" \
      "$@" | grep "valid split | MLM loss"
  }
  one=$(score 1 1) grid=$(score 4 2) pipeline=$(score 4 2 --set parallel.pipeline_parallel=2)
  echo "1 rank:      $one"; echo "tp 2 x dp 2: $grid"; echo "tp 2 x pp 2: $pipeline"
  [[ "$one" == "$grid" && "$one" == "$pipeline" &&
     "$one" =~ binary-head\ accuracy\ (0|1|0\.[0-9]+)\ \| ]] ||
    { echo "bert decomposition: evaluate differs or has no accuracy"; exit 1; }
else
  echo "bert decomposition: no $data/brown.jsonl or $vocab: the indexed case is skipped"
fi
echo "bert decomposition: identical"
