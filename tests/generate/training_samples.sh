#!/usr/bin/env bash
# logging.sample_interval for each family: the sample lines of tp 2, pp 2
# and tp 2 x pp 2 runs equal those of one rank, and the losses of a run with
# samples equal those without.
#   gpt   greedy continuations of the EOD token (tiny.deck);
#   t5    encoder input -> greedy decoder output of three id prompts
#         (tiny.deck + t5.deck);
#   bert  fill-mask of two text prompts and an id prompt through a small
#         WordPiece vocabulary (tiny.deck + bert.deck; a wide init so that the
#         top tokens stand apart by more than the layouts' rounding).
#   training_samples.sh MPIEXEC MESHTRON DECK WORK   (DECK: tests/train/tiny.deck)
set -euo pipefail
mpiexec=$1 meshtron=$2 deck=$3 work=$4
here=$(cd "$(dirname "$0")" && pwd)
decks=$(dirname "$deck")
rm -rf "$work" && mkdir -p "$work"
printf '%s\n' '{"ids": [5, 7, 11, 3, 19, 1]}' '{"ids": [8, 1]}' '{"ids": [40, 41, 42, 43, 1]}' \
  > "$work/t5_prompts.jsonl"
printf '%s\n' '{"text": "the capital of france is [MASK] ."}' \
  '{"text": "[MASK] is the capital of [MASK] , he said ."}' '{"ids": [2, 10, 4, 30, 3]}' \
  > "$work/bert_prompts.jsonl"
family_sets() {  # family_sets FAMILY: its decks and settings
  case $1 in
    gpt) echo "$deck" ;;
    t5) echo "$deck $decks/t5.deck --set logging.sample_prompts=$work/t5_prompts.jsonl" ;;
    bert) echo "$deck $decks/bert.deck --set data.tokenizer=bert_wordpiece_lowercase" \
               "--set data.vocab_file=$here/fill_mask_vocab.txt --set model.init_method_std=0.5" \
               "--set logging.sample_prompts=$work/bert_prompts.jsonl" ;;
  esac
}
samples() { grep -E '^ sample \| step' <<<"$1" || true; }
losses() { grep -oE 'loss [0-9.]+ \| grad norm [0-9.]+' <<<"$1" || true; }
for family in gpt t5 bert; do
  read -r -a sets <<<"$(family_sets $family)"
  run() {  # run NP NAME SETS...
    local np=$1 name=$2; shift 2
    "$mpiexec" --oversubscribe -np "$np" "$meshtron" train "${sets[@]}" \
      --set training.train_iters=4 --set logging.sample_tokens=8 --set checkpoint.save_dir= \
      --set run.output_dir="$work/$family/$name" "$@" 2>&1
  }
  one=$(run 1 one --set logging.sample_interval=2)
  prompts=$([ $family = gpt ] && echo 1 || echo 3)
  [ "$(samples "$one" | wc -l)" -eq $((2 * prompts)) ] ||
    { echo "FAIL: $family: expected $((2 * prompts)) sample lines"; echo "$one"; exit 1; }
  for layout in "tp2 2 --set parallel.tensor_parallel=2" "pp2 2 --set parallel.pipeline_parallel=2" \
                "grid 4 --set parallel.tensor_parallel=2 --set parallel.pipeline_parallel=2"; do
    read -r -a l <<<"$layout"
    out=$(run "${l[1]}" "${l[0]}" --set logging.sample_interval=2 "${l[@]:2}")
    [ "$(samples "$one")" == "$(samples "$out")" ] ||
      { echo "FAIL: $family samples differ between 1 rank and ${l[0]}"; samples "$one"; echo "$out"; exit 1; }
  done
  plain=$(run 4 plain --set logging.sample_interval=0 --set parallel.tensor_parallel=2 \
              --set parallel.pipeline_parallel=2)
  grid=$(run 4 grid --set logging.sample_interval=2 --set parallel.tensor_parallel=2 \
             --set parallel.pipeline_parallel=2)
  [ -n "$(losses "$plain")" ] && [ "$(losses "$grid")" == "$(losses "$plain")" ] ||
    { echo "FAIL: $family: samples changed the losses"; losses "$grid"; losses "$plain"; exit 1; }
  samples "$grid"
done
echo "PASS"
