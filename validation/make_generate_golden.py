#!/usr/bin/env python3
"""Golden generations for `meshtron generate`: transformers' `generate` on
the golden GPT-2 of validation/gpt2-golden (make_gpt2_golden.py), greedy and
beam search, in float32 on CPU.

How to rerun
------------
Needs python3 with torch and transformers (5.x was used for gpt2-golden).
Runs on CPU in seconds; no GPU is used.

    cd validation
    python3 make_generate_golden.py --model gpt2-golden --out gpt2-golden-generate

Outputs (in --out)
------------------
prompts.jsonl
    Two prompts of different lengths (7 and 4 ids < 1000, from a generator
    seeded with 1234), one {"ids": [...]} a line.
expected.json
    {"max_new_tokens": 20, "num_beams": 4, "length_penalty": 0.6,
     "greedy": [[20 ids], [20 ids]], "beam": [[ids], [ids]], "versions": {...}}
    greedy: generate(do_sample=False, num_beams=1); beam: generate(
    do_sample=False, num_beams=4, length_penalty=0.6, early_stopping=False).
    Only the generated ids (the prompt removed). Each prompt is generated
    alone (a batch of one: no padding, positions from 0), so the ids are
    what meshtron must produce for the two prompts decoded in one batch.
    The model's EOS id (50256) lies outside its 1000-token vocabulary, so
    every sequence runs to max_new_tokens.

tests/generate/test_generate_golden.cpp compares meshtron's ids with these
exactly, on 1 rank, tp 2, pp 2 and tp 2 x pp 2.
"""
import argparse
import json
import os

import torch
import transformers
from transformers import GPT2LMHeadModel

MAX_NEW_TOKENS = 20
NUM_BEAMS = 4
LENGTH_PENALTY = 0.6
PROMPT_LENGTHS = (7, 4)


def prompts():
    generator = torch.Generator().manual_seed(1234)
    return [torch.randint(0, 1000, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]


def generated_ids(model, prompt, **kwargs):
    input_ids = torch.tensor([prompt], dtype=torch.long)
    with torch.no_grad():
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                             max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                             pad_token_id=model.config.eos_token_id, **kwargs)
    return out[0, len(prompt):].tolist()


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.path.join(here, "gpt2-golden"))
    parser.add_argument("--out", default=os.path.join(here, "gpt2-golden-generate"))
    args = parser.parse_args()

    torch.manual_seed(1234)
    model = GPT2LMHeadModel.from_pretrained(args.model, attn_implementation="eager").float().eval()
    ps = prompts()
    greedy = [generated_ids(model, p, num_beams=1) for p in ps]
    beam = [generated_ids(model, p, num_beams=NUM_BEAMS, length_penalty=LENGTH_PENALTY,
                          early_stopping=False) for p in ps]
    for ids in greedy:
        assert len(ids) == MAX_NEW_TOKENS, ids

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "prompts.jsonl"), "w") as f:
        for p in ps:
            f.write(json.dumps({"ids": p}) + "\n")
    expected = {
        "max_new_tokens": MAX_NEW_TOKENS,
        "num_beams": NUM_BEAMS,
        "length_penalty": LENGTH_PENALTY,
        "greedy": greedy,
        "beam": beam,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    with open(os.path.join(args.out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")
    print("wrote", args.out, json.dumps(expected))


if __name__ == "__main__":
    main()
