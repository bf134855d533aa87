#!/usr/bin/env bash
# Hyperparameter sweep of the default job's deck (input_decks/gpt-tiny.deck),
# as run for issue 7 (perf/RESULTS.md, "The default job"). The loss
# trajectory does not depend on the decomposition, so each variant trains at
# one rank; on a GPU (DEVICE=cuda, fp32) a variant takes seconds.
#
#   perf/sweep_default_job.sh VARIANTS [DATA_DIR]
#
# VARIANTS: one variant per line, "name|--set key=value --set ...";
# DATA_DIR: brown_text_document.{bin,idx}, encoder.json, vocab.bpe (default
# data/). LANES runs (default 4) share the machine; each lane has its own
# copy of the dataset, because runs with the same sample count would race on
# the cached index files. Prints each variant's validation losses.
set -euo pipefail
variants=$1
data=${2:-data}
M=${M:-build/meshtron}
DEVICE=${DEVICE:-cuda}
LANES=${LANES:-4}
OUT=${SWEEP_DIR:-/tmp/sweep}
mapfile -t cfgs < <(grep -v '^\s*\(#\|$\)' "$variants")
for l in $(seq 0 $((LANES - 1))); do
  mkdir -p "$OUT/lane$l"
  cp "$data"/brown_text_document.bin "$data"/brown_text_document.idx "$data"/encoder.json \
     "$data"/vocab.bpe "$OUT/lane$l/"
done
run_lane() {
  local l=$1 i=0 c name ov
  for c in "${cfgs[@]}"; do
    if (( i % LANES == l )); then
      name=${c%%|*} ov=${c#*|}
      # shellcheck disable=SC2086  # $ov is a list of --set arguments
      "$M" train input_decks/gpt-tiny.deck --set run.device="$DEVICE" \
        --set parallel.tensor_parallel=1 --set run.output_dir="$OUT/runs/$name" \
        --set data.path="$OUT/lane$l/brown_text_document" \
        --set data.vocab_file="$OUT/lane$l/encoder.json" \
        --set data.merge_file="$OUT/lane$l/vocab.bpe" \
        --set logging.progress=off --set checkpoint.save_dir= $ov > "$OUT/$name.log" 2>&1 || true
      echo "$name: $(grep -h eval_loss "$OUT/runs/$name"/*/metrics.jsonl 2>/dev/null |
        sed 's/.*"iteration": \([0-9]*\).*"eval_loss": \([0-9.]*\).*/\1:\2/' | tr '\n' ' ')"
    fi
    i=$((i + 1))
  done
}
for l in $(seq 0 $((LANES - 1))); do run_lane "$l" > "$OUT/lane$l.txt" & done
wait
cat "$OUT"/lane*.txt | sort
