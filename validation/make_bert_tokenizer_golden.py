#!/usr/bin/env python3
"""Golden BERT WordPiece ids for meshtron's bert_wordpiece_lowercase and
bert_wordpiece_cased tokenizers, made by transformers' BertTokenizer (slow,
Python, before transformers 5; the Rust tokenizers' from 5 on, which lowercase
each character alone: the C++ test leaves out lowercase texts with a capital
sigma, whose word-final form only Python's str.lower() gives) on
bert-base-uncased's vocab.txt (data/, from
tools/fetch-corpus.sh), for every non-empty line of
tests/tokenizer/hard_strings.txt and every text of
tests/tokenizer/bert_hard_strings.jsonl.

Ids are those of the text alone (add_special_tokens=False). Texts holding a
special token's name ([CLS], ...) are left out: BertTokenizer keeps those
whole, meshtron (as Megatron) reads them as plain text. For the cased
variant, texts that are not in NFC are left out too: the slow BertTokenizer
composes them first, Megatron's tokenizer and meshtron do not (the JavaScript
comparison, tokenizer_bert_vs_js, covers them).

How to rerun
------------
    python3 validation/make_bert_tokenizer_golden.py --out validation/bert-tokenizer-golden
    python3 validation/make_bert_tokenizer_golden.py --vocab /path/to/vocab.txt --out DIR

then keep DIR/ids.json in validation/bert-tokenizer-golden/ (the C++ test
tokenizer_bert_golden registers once that folder exists).

Output: OUT/ids.json
--------------------
{"library": "transformers 4.x", "vocab_sha256": "...",
 "lowercase": {"strings": [...], "ids": [[...], ...]},
 "cased":     {"strings": [...], "ids": [[...], ...]}}
"""
import argparse
import hashlib
import json
import pathlib
import unicodedata

import transformers
from transformers import BertTokenizer

ROOT = pathlib.Path(__file__).resolve().parent.parent
SPECIAL = ("[CLS]", "[SEP]", "[MASK]", "[PAD]", "[UNK]")


def texts():
    lines = (ROOT / "tests/tokenizer/hard_strings.txt").read_bytes().decode("utf-8", "replace")
    out = [line for line in lines.split("\n") if line]
    with open(ROOT / "tests/tokenizer/bert_hard_strings.jsonl", encoding="utf-8") as f:
        out += [json.loads(line)["text"] for line in f if line.strip()]
    return [t for t in out if not any(s in t for s in SPECIAL)]


def variant(vocab, lower_case, strings):
    tok = BertTokenizer(str(vocab), do_lower_case=lower_case)
    if not lower_case:
        strings = [t for t in strings if unicodedata.normalize("NFC", t) == t]
    return {"strings": strings,
            "ids": [tok.encode(t, add_special_tokens=False) for t in strings]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vocab", default=str(ROOT / "data/bert-base-uncased-vocab.txt"))
    parser.add_argument("--out", default=str(ROOT / "validation/bert-tokenizer-golden"))
    args = parser.parse_args()
    vocab = pathlib.Path(args.vocab)
    strings = texts()
    golden = {
        "library": f"transformers {transformers.__version__}",
        "vocab_sha256": hashlib.sha256(vocab.read_bytes()).hexdigest(),
        "lowercase": variant(vocab, True, strings),
        "cased": variant(vocab, False, strings),
    }
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ids.json").write_text(json.dumps(golden, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {out / 'ids.json'}: {len(golden['lowercase']['strings'])} lowercase, "
          f"{len(golden['cased']['strings'])} cased strings")


if __name__ == "__main__":
    main()
