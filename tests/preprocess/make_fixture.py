#!/usr/bin/env python3
"""Writes the preprocess test fixtures beside this script:

  fixture.jsonl  one {"id": n, "text": ...} object per line
  fixture.txt    the same documents as plain text, separated by blank lines
                 (one, two, or a white-space-only line, to exercise the rule)

Both must preprocess to byte-identical datasets. Documents hold no blank
lines, so the plain-text form can represent them; paragraphs are single
newlines. Rerun after editing DOCUMENTS:  python3 tests/preprocess/make_fixture.py
"""
import json
import pathlib

DOCUMENTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Preprocessing turns raw text into token ids.\n"
    "Each document is written as one sequence, and the index records where it starts.",
    "It's a truth universally acknowledged -- isn't it? -- that we'll need contractions: "
    "they're, I've, you'd, she'll, I'm.",
    "Numbers: 3.14159, 2,718, 1e-9, 0x1F, and the year 1961.",
    "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u2014 \u00fcber stra\u00dfe, \u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u03ba\u03cc\u03c3\u03bc\u03b5.",
    "\u4e2d\u6587\u6587\u672c\u548c\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3002\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8.",
    "Emoji survive byte-level BPE: \U0001F642 \U0001F680 \U0001F468\u200d\U0001F469\u200d\U0001F467.",
    "    Indented first line, trailing text.\n\tA tab-indented second line.",
    "The literal text <|endoftext|> inside a document is ordinary text, not the EOD token.",
    "\"Quoted,\" he said; 'single quotes' too. Brackets [a] {b} (c) and back\\slashes \\n.",
    "A longer document follows, so that rank boundaries fall in the middle of one.\n"
    + " ".join(f"Sentence number {i} talks about parallel preprocessing across ranks." for i in range(40))
    + "\nIts last paragraph ends here.",
    "Short.",
    "x",
    "Line one.\nLine two.\nLine three.\nLine four.\nLine five.",
    "Mixed    spacing   is   kept   as   is,   and   so   are   trailing   spaces   ",
    "Another long one: "
    + " ".join(f"word{i}" for i in range(300)),
    "Accents at the end \u00e0\u00e8\u00ec\u00f2\u00f9",
    "Math-ish: \u2200x \u2208 \u211d, x\u00b2 \u2265 0; \u2211\u1d62 a\u1d62 = \u221e?",
    "Penultimate document with a URL https://example.org/a?b=c&d=e#f.",
    "The final document has no newline after it in the text file.",
]

SEPARATORS = ["\n\n", "\n\n\n", "\n \t\n"]


def main():
    here = pathlib.Path(__file__).resolve().parent
    with open(here / "fixture.jsonl", "w", encoding="utf-8", newline="\n") as f:
        for i, text in enumerate(DOCUMENTS):
            f.write(json.dumps({"id": i, "text": text}, ensure_ascii=(i % 2 == 0)) + "\n")
    parts = []
    for i, text in enumerate(DOCUMENTS):
        if i > 0:
            parts.append(SEPARATORS[i % len(SEPARATORS)])
        parts.append(text)
    (here / "fixture.txt").write_bytes(("\n" + "".join(parts)).encode("utf-8"))


if __name__ == "__main__":
    main()
