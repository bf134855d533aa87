#!/usr/bin/env bash
# meshtron generate on a BERT checkpoint (tiny.deck + bert.deck, a small
# WordPiece vocabulary, 2 training steps on synthetic BERT batches): the
# fill-mask of five prompts (text with one or two [MASK], ids) equal on
# 1 rank, tp 2, pp 2, tp 2 x dp 2 and tp 2 x pp 2: the same top tokens of
# each mask (tokens whose probabilities lie within 1e-6 of one another may
# trade places) and probabilities to 1e-6; every mask of each prompt
# listed, its top_k probabilities best first, the text its best fill.
#   fill_mask.sh MPIEXEC MESHTRON WORK
set -euo pipefail
mpiexec=$1 meshtron=$2 work=$3
here=$(cd "$(dirname "$0")" && pwd)
sets=("$here/../train/tiny.deck" "$here/../train/bert.deck" --set data.tokenizer=bert_wordpiece_lowercase
      --set data.vocab_file="$here/fill_mask_vocab.txt" --set model.init_method_std=0.5)
rm -rf "$work" && mkdir -p "$work"
"$mpiexec" --oversubscribe -np 1 "$meshtron" train "${sets[@]}" --set run.output_dir="$work/runs" \
  --set checkpoint.save_dir="$work/ckpt" --set training.train_iters=2 \
  --set checkpoint.save_interval=2 > "$work/train.log" 2>&1
printf '%s\n' '{"text": "the capital of france is [MASK] ."}' \
  '{"text": "[MASK] is the capital of [MASK] , he said ."}' '{"ids": [2, 10, 4, 30, 3]}' \
  '{"text": "the king and the [MASK] walked to the river ."}' '{"text": "[MASK]"}' > "$work/prompts.jsonl"
generate() {  # generate NP NAME SETS...
  local np=$1 name=$2; shift 2
  "$mpiexec" --oversubscribe -np "$np" "$meshtron" generate "${sets[@]}" \
    --set run.output_dir="$work/gen" --set checkpoint.load="$work/ckpt/iter_0000002.h5" \
    --set generate.prompts="$work/prompts.jsonl" --set generate.top_k=4 \
    --set generate.output="$work/$name.jsonl" "$@" > "$work/$name.log" 2>&1 ||
    { echo "FAIL: $name"; cat "$work/$name.log"; exit 1; }
}
generate 1 one
generate 2 tp2 --set parallel.tensor_parallel=2
generate 2 pp2 --set parallel.pipeline_parallel=2
generate 4 tp2dp2 --set parallel.tensor_parallel=2 --set parallel.data_parallel=2
generate 4 tp2pp2 --set parallel.tensor_parallel=2 --set parallel.pipeline_parallel=2
python3 - "$work" one tp2 pp2 tp2dp2 tp2pp2 <<'PY' || exit 1
import json, sys
work, names = sys.argv[1], sys.argv[2:]
def rows(name):
    return [json.loads(l) for l in open(f"{work}/{name}.jsonl")]
def groups(tokens):
    """Runs of tokens whose probabilities lie within 1e-6 of the one before."""
    out = []
    for t in tokens:
        if out and abs(out[-1][-1]["score"] - t["score"]) < 1e-6: out[-1].append(t)
        else: out.append([t])
    return out
ref = rows("one")
assert [r["index"] for r in ref] == list(range(5)), ref
for r in ref:
    masks = [m["position"] for m in r["masks"]]
    assert masks == [p for p, i in enumerate(r["prompt_ids"]) if i == 4], r
    for m in r["masks"]:
        scores = [t["score"] for t in m["tokens"]]
        assert len(scores) == 4 and scores == sorted(scores, reverse=True), m
        assert 0 < sum(scores) <= 1 + 1e-9, m
        assert m["tokens"][0]["token"] in r["text"].split(), r
for name in names[1:]:
    for a, b in zip(ref, rows(name)):
        assert a["prompt_ids"] == b["prompt_ids"] and len(a["masks"]) == len(b["masks"]), (name, a, b)
        for ma, mb in zip(a["masks"], b["masks"]):
            sa = [t["score"] for t in ma["tokens"]]
            sb = [t["score"] for t in mb["tokens"]]
            assert all(abs(x - y) < 1e-6 for x, y in zip(sa, sb)), (name, ma, mb)
            ga, gb = groups(ma["tokens"]), groups(mb["tokens"])
            assert len(ga) == len(gb), (name, ma, mb)
            for k, (x, y) in enumerate(zip(ga, gb)):  # the last run may continue past top_k
                if k + 1 < len(ga):
                    assert sorted(t["id"] for t in x) == sorted(t["id"] for t in y), (name, ma, mb)
print("fill-mask equal on", ", ".join(names))
PY
head -n 2 "$work/one.jsonl"
echo "PASS"
