#!/usr/bin/env bash
# meshtron generate on a T5 checkpoint (tiny.deck + t5.deck, 2 training
# steps on synthetic T5 batches): the encoder inputs of three prompts of
# different lengths, greedy, sampled and beam ids equal on 1 rank, tp 2,
# tp 2 x dp 2, pp 2 (encoder | decoder) and tp 2 x pp 2, and the beam ids on
# pp 4 split 2 (two encoder stages, two decoder stages); every result
# max_new_tokens long or ended by eos (1).
#   t5_generate.sh MPIEXEC MESHTRON WORK
set -euo pipefail
mpiexec=$1 meshtron=$2 work=$3
here=$(cd "$(dirname "$0")" && pwd)
decks=("$here/../train/tiny.deck" "$here/../train/t5.deck")
rm -rf "$work" && mkdir -p "$work"
"$mpiexec" --oversubscribe -np 1 "$meshtron" train "${decks[@]}" --set run.output_dir="$work/runs" \
  --set checkpoint.save_dir="$work/ckpt" --set training.train_iters=2 \
  --set checkpoint.save_interval=2 > "$work/train.log" 2>&1
printf '%s\n' '{"ids": [5, 7, 11, 3, 19]}' '{"ids": [8, 5, 3]}' \
  '{"ids": [40, 41, 42, 43, 44, 45, 46, 1]}' > "$work/prompts.jsonl"
generate() {  # generate NP NAME SETS...
  local np=$1 name=$2; shift 2
  "$mpiexec" --oversubscribe -np "$np" "$meshtron" generate "${decks[@]}" \
    --set run.output_dir="$work/gen" --set checkpoint.load="$work/ckpt/iter_0000002.h5" \
    --set generate.prompts="$work/prompts.jsonl" --set generate.max_new_tokens=6 \
    --set generate.output="$work/$name.jsonl" "$@" > "$work/$name.log" 2>&1 ||
    { echo "FAIL: $name"; cat "$work/$name.log"; exit 1; }
}
for decoding in greedy sample beam; do
  sets=(--set generate.decoding=$decoding --set generate.top_k=20 --set generate.num_beams=3)
  generate 1 "one_$decoding" "${sets[@]}"
  generate 2 "tp2_$decoding" "${sets[@]}" --set parallel.tensor_parallel=2
  generate 4 "tp2dp2_$decoding" "${sets[@]}" --set parallel.tensor_parallel=2 \
    --set parallel.data_parallel=2
  generate 2 "pp2_$decoding" "${sets[@]}" --set parallel.pipeline_parallel=2
  generate 4 "tp2pp2_$decoding" "${sets[@]}" --set parallel.tensor_parallel=2 \
    --set parallel.pipeline_parallel=2
  layouts=(tp2 tp2dp2 pp2 tp2pp2)
  if [ "$decoding" = beam ]; then
    generate 4 "pp4_$decoding" "${sets[@]}" --set parallel.pipeline_parallel=4 \
      --set parallel.pipeline_split_rank=2
    layouts+=(pp4)
  fi
  for layout in "${layouts[@]}"; do
    cmp -s "$work/one_$decoding.jsonl" "$work/${layout}_$decoding.jsonl" ||
      { echo "FAIL: $decoding ids differ between 1 rank and $layout";
        cat "$work/one_$decoding.jsonl" "$work/${layout}_$decoding.jsonl"; exit 1; }
  done
  python3 - "$work/one_$decoding.jsonl" <<'PY' || exit 1
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["index"] for r in rows] == [0, 1, 2], rows
for r in rows:
    ids = r["ids"]
    assert len(ids) == 6 or (ids and ids[-1] == 1 and r["finish_reason"] == "stop"), r
    assert all(0 <= i < 100 for i in ids), r
PY
  head -n 3 "$work/one_$decoding.jsonl"
done
[ "$(cat "$work/one_sample.jsonl")" != "$(cat "$work/one_greedy.jsonl")" ] ||
  { echo "FAIL: sampling gave the greedy ids"; exit 1; }
echo "PASS"
