#!/usr/bin/env bash
# Fine-tuning rows (data.source = jsonl), end to end; one case per call:
#   decomposition_gpt  pre-tokenized prompt/completion rows on tiny.deck:
#                      the same losses, validation losses and gradient norms
#                      (4 steps, dropout on, rows cut and epochs wrapping) on
#                      1 rank, tp 2 x dp 2, pp 2 x dp 2 and dp 4; meshtron
#                      evaluate's completion-token loss of the 1-rank
#                      checkpoint the same on 1 rank, tp 2 x pp 2 and dp 2;
#                      text rows of README's Brown pairs through the
#                      SentencePiece Brown model, 1 rank = tp 2 x dp 2
#   decomposition_t5   the same for T5 (tiny.deck + t5.deck): input/target id
#                      rows on 1 rank, tp 2 x dp 2, pp 2 x dp 2; evaluate on
#                      1 rank and tp 2 x pp 2; text rows through SentencePiece
#   restart_replay     6 steps = 3 steps, save, resume, 3 more (tp 2 x dp 2;
#                      the steps cross epochs): losses and final weights
#   bad_rows           one error line on 2 ranks: malformed JSON at line N, a
#                      row of no known shape, an empty file, a missing file
#
#   sft.sh CASE MESHTRON WORKDIR MPIEXEC [MPIEXEC ARGS...]
set -euo pipefail
case_name=$1 meshtron=$2 work=$3; shift 3
mpiexec=("$@")
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
spm="$repo/validation/sentencepiece-brown/tokenizer.model"
rm -rf "$work" && mkdir -p "$work"

# rows NAME COUNT SHAPE: COUNT random pre-tokenized rows (ids in [2, 100)),
# some longer than tiny.deck's lengths so that they are cut.
rows() {
  python3 - "$work/$1.jsonl" "$2" "$3" <<'PY'
import json, os, random, sys
path, count, shape = sys.argv[1], int(sys.argv[2]), sys.argv[3]
r = random.Random(os.path.basename(path) + shape)
ids = lambda lo, hi: [r.randrange(2, 100) for _ in range(r.randrange(lo, hi))]
keys = ("prompt_ids", "completion_ids") if shape == "gpt" else ("input_ids", "target_ids")
with open(path, "w") as f:
    for _ in range(count):
        first, second = (ids(0, 14), ids(1, 10)) if shape == "gpt" else (ids(1, 20) + [1], ids(0, 10) + [1])
        f.write(json.dumps({keys[0]: first, keys[1]: second}) + "\n")
PY
}
run() {  # run NAME RANKS [--set ...]
  local name=$1 ranks=$2; shift 2
  "${mpiexec[@]}" -np "$ranks" "$meshtron" train "${decks[@]}" --set run.name="$name" \
    --set run.output_dir="$work/runs" --set training.train_iters=4 \
    --set training.eval_interval=2 --set training.eval_iters=2 "${data[@]}" "$@" > "$work/$name.log"
}
same() {  # same ONE OTHER: losses, grad norms and validation losses to 1e-5
  python3 "$here/compare_losses.py" "$work/runs/$1/metrics.jsonl" "$work/runs/$2/metrics.jsonl" 1 4 1e-5
  python3 - "$work/runs/$1/metrics.jsonl" "$work/runs/$2/metrics.jsonl" <<'PY'
import json, sys
evals = [[json.loads(l)["eval_loss"] for l in open(p) if "eval_loss" in l] for p in sys.argv[1:]]
assert len(evals[0]) == 2 and len(evals[1]) == 2, f"expected 2 validation losses each: {evals}"
assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(*evals)), f"validation losses differ: {evals}"
PY
}
score() {  # score RANKS [--set ...]: evaluate's result line for the 1-rank checkpoint
  local ranks=$1; shift
  "${mpiexec[@]}" -np "$ranks" "$meshtron" evaluate "${decks[@]}" "${data[@]}" \
    --set checkpoint.load="$work/ckpt/iter_0000004.h5" "$@" | grep -E "^(evaluate|) ?(valid )?\|"
}
same_scores() {  # same_scores LINE...: identical, some tokens scored
  echo "evaluate: $*" | tr '\n' ' '; echo
  local first=$1; shift
  for line in "$@"; do [[ "$line" == "$first" ]] || { echo "sft: evaluate differs"; exit 1; }; done
  [[ "$first" =~ (tokens|,)\ [1-9][0-9]* ]] || { echo "sft: evaluate scored nothing"; exit 1; }
}
nosave=(--set checkpoint.save_dir=)

case $case_name in
decomposition_gpt)
  rows train 37 gpt; rows valid 5 gpt
  decks=("$here/tiny.deck")
  data=(--set data.source=jsonl --set data.path="$work/train.jsonl" --set data.valid_path="$work/valid.jsonl")
  run one 1 --set checkpoint.save_dir="$work/ckpt"
  grep -q "37 rows, [1-9][0-9]* cut" "$work/one.log" || { echo "sft: no row was cut"; exit 1; }
  run grid 4 "${nosave[@]}" --set parallel.tensor_parallel=2
  same one grid
  run pp2 4 "${nosave[@]}" --set parallel.pipeline_parallel=2
  same one pp2
  run dp4 4 "${nosave[@]}"
  same one dp4
  same_scores "$(score 1)" "$(score 4 --set parallel.tensor_parallel=2 --set parallel.pipeline_parallel=2)" \
    "$(score 2)"
  data=(--set data.source=jsonl --set data.path="$repo/input_decks/sft/brown-pairs.jsonl"
        --set data.valid_path="$repo/input_decks/sft/brown-pairs-valid.jsonl"
        --set data.tokenizer=sentencepiece --set data.tokenizer_model="$spm" --set model.vocab_size=0
        --set model.seq_length=32 --set model.max_position_embeddings=32)
  run text_one 1 "${nosave[@]}"
  run text_grid 4 "${nosave[@]}" --set parallel.tensor_parallel=2
  same text_one text_grid
  ;;
decomposition_t5)
  rows train 29 t5; rows valid 6 t5
  decks=("$here/tiny.deck" "$here/t5.deck")
  data=(--set data.source=jsonl --set data.path="$work/train.jsonl" --set data.valid_path="$work/valid.jsonl")
  run one 1 --set checkpoint.save_dir="$work/ckpt"
  run grid 4 "${nosave[@]}" --set parallel.tensor_parallel=2
  same one grid
  run pp2 4 "${nosave[@]}" --set parallel.pipeline_parallel=2
  same one pp2
  same_scores "$(score 1)" "$(score 4 --set parallel.tensor_parallel=2 --set parallel.pipeline_parallel=2)"
  python3 - "$work/text_train.jsonl" "$repo/input_decks/sft/brown-pairs.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as out:
    for line in open(sys.argv[2]):
        row = json.loads(line)
        out.write(json.dumps({"input": "continue: " + row["prompt"], "target": row["completion"]}) + "\n")
PY
  data=(--set data.source=jsonl --set data.path="$work/text_train.jsonl" --set data.valid_path="$work/text_train.jsonl"
        --set data.tokenizer=sentencepiece --set data.tokenizer_model="$spm" --set model.vocab_size=0)
  run text_one 1 "${nosave[@]}"
  run text_grid 4 "${nosave[@]}" --set parallel.tensor_parallel=2
  same text_one text_grid
  ;;
restart_replay)
  rows train 21 gpt
  decks=("$here/tiny.deck")
  data=(--set data.source=jsonl --set data.path="$work/train.jsonl" --set parallel.tensor_parallel=2)
  replay() { "${mpiexec[@]}" -np 4 "$meshtron" train "${decks[@]}" "${data[@]}" \
               --set run.output_dir="$work/runs" "$@" > /dev/null; }
  replay --set run.name=whole --set checkpoint.save_dir="$work/whole"
  replay --set run.name=split --set checkpoint.save_dir="$work/split" --set training.train_iters=3
  replay --set run.name=split --set checkpoint.save_dir="$work/split" --set checkpoint.load=auto
  python3 "$here/compare_losses.py" "$work/runs/whole/metrics.jsonl" "$work/runs/split/metrics.jsonl" 1 6 1e-6
  h5diff --relative=1e-6 "$work/whole/iter_0000006.h5" "$work/split/iter_0000006.h5" /model /model
  ;;
bad_rows)
  refused() {  # refused REGEX FILE
    "$here/../foundation/expect_error.sh" "$1" "${mpiexec[@]}" -np 2 "$meshtron" train "$here/tiny.deck" \
      --set data.source=jsonl --set data.path="$2" --set run.output_dir="$work/runs" "${nosave[@]}"
  }
  good='{"prompt_ids": [1, 2], "completion_ids": [3]}'
  printf '%s\n%s\n{"prompt_ids": [1,\n' "$good" "$good" > "$work/malformed.jsonl"
  refused "malformed.jsonl:3: not valid JSON" "$work/malformed.jsonl"
  printf '%s\n{"question": "?", "answer": "!"}\n' "$good" > "$work/shapeless.jsonl"
  refused "shapeless.jsonl:2: a row is \{\"prompt\"" "$work/shapeless.jsonl"
  : > "$work/empty.jsonl"
  refused "data.path: no row in '.*empty.jsonl'" "$work/empty.jsonl"
  refused "data.path: cannot read '.*missing.jsonl'" "$work/missing.jsonl"
  ;;
*) echo "sft.sh: unknown case $case_name"; exit 2 ;;
esac
echo "sft $case_name: ok"
