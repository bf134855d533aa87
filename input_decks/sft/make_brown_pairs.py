#!/usr/bin/env python3
"""Makes the fine-tuning example of README.md ("Supervised fine-tuning"):
prompt/completion pairs from the Brown corpus, the prompt a line and the
completion the line after it (a line of Brown is a sentence or two).

    python3 input_decks/sft/make_brown_pairs.py data/brown.jsonl input_decks/sft

writes brown-pairs.jsonl (48 pairs, training) and brown-pairs-valid.jsonl
(8 pairs, validation): the first pair of short sentences (at most 120
characters each) of each document, in corpus order, documents 0-47 and
48-55. The output depends only on the corpus, so running it again gives
the same files.
"""
import json
import sys

MAX_CHARS = 120
TRAIN, VALID = 48, 8


def first_short_pair(text):
    lines = [line.strip() for line in text.split("\n") if line.strip()]
    for first, second in zip(lines, lines[1:]):
        if len(first) <= MAX_CHARS and len(second) <= MAX_CHARS:
            return {"prompt": first + "\n", "completion": second}
    return None


def main(corpus, out_dir):
    pairs = []
    with open(corpus, encoding="utf-8") as f:
        for line in f:
            pair = first_short_pair(json.loads(line)["text"])
            if pair:
                pairs.append(pair)
            if len(pairs) == TRAIN + VALID:
                break
    assert len(pairs) == TRAIN + VALID, f"only {len(pairs)} pairs in {corpus}"
    for name, rows in (("brown-pairs.jsonl", pairs[:TRAIN]),
                       ("brown-pairs-valid.jsonl", pairs[TRAIN:])):
        with open(f"{out_dir}/{name}", "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])
