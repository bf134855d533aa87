#!/usr/bin/env python3
"""Golden reference for `meshtron evaluate` on an indexed dataset: the loss of
the golden GPT-2 (validation/gpt2-golden) on the ordered samples of a few
fixed documents, computed with Hugging Face transformers on CPU in float32.

How to rerun
------------
Needs python3 with torch and transformers (the versions of
make_gpt2_golden.py). Runs on CPU in a second; no GPU is used.

    cd validation
    python3 make_evaluate_golden.py --out evaluate-golden

Where the build machine has no torch, run it on any machine that has, and
copy evaluate-golden/golden.json back into validation/.

What it computes
----------------
Documents: DOC_LENGTHS ids each, drawn by torch.randint(0, 1000) from a
generator seeded with SEED. tests/evaluate writes them, one sequence per
document, into an indexed dataset and runs `meshtron evaluate` with
evaluate.split = all on the converted golden model.

Samples, as meshtron (and Megatron's GPTDataset over one epoch without
shuffling) define them: the documents concatenated in order into one stream
of T tokens; sample j is stream[j*S : j*S + S + 1] for j < (T - 1) // S,
S = SEQ_LENGTH. Sample j's inputs are its first S tokens, its targets the
last S; its loss sum adds -log_softmax(logits[t])[target[t]] over its S
positions, with the float32 logits of GPT2LMHeadModel (eval mode, eager
attention) and log_softmax in float64.

golden.json
    seq_length, split ("all"), documents (lists of ids), samples (one object
    per sample: ids, loss_sum, tokens), tokens (all targets), lm_loss (sum of
    every loss_sum / tokens), ppl (exp(lm_loss)), versions.
"""
import argparse
import json
import math
import os

import torch
import torch.nn.functional as F
import transformers
from transformers import GPT2LMHeadModel

SEED = 4321
DOC_LENGTHS = (37, 23, 50)
SEQ_LENGTH = 16
VOCAB = 1000
MODEL_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpt2-golden")


def make_documents():
    generator = torch.Generator().manual_seed(SEED)
    return [torch.randint(0, VOCAB, (n,), generator=generator).tolist() for n in DOC_LENGTHS]


def ordered_samples(documents):
    """The windows of SEQ_LENGTH + 1 tokens with stride SEQ_LENGTH."""
    stream = [t for doc in documents for t in doc]
    count = (len(stream) - 1) // SEQ_LENGTH
    return [stream[j * SEQ_LENGTH: j * SEQ_LENGTH + SEQ_LENGTH + 1] for j in range(count)]


def load_model():
    model = GPT2LMHeadModel.from_pretrained(MODEL_DIR, attn_implementation="eager").float()
    model.eval()
    assert model.config.vocab_size == VOCAB, model.config.vocab_size
    return model


@torch.no_grad()
def score(model, samples):
    ids = torch.tensor(samples, dtype=torch.long)  # [n, S + 1]
    logits = model(ids[:, :-1]).logits  # [n, S, V] float32
    assert logits.dtype == torch.float32
    logp = F.log_softmax(logits.double(), dim=-1)
    losses = -logp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # [n, S] float64
    return [{"ids": s, "loss_sum": float(l.sum()), "tokens": SEQ_LENGTH}
            for s, l in zip(samples, losses)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="evaluate-golden",
                        help="output folder (created if missing)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(SEED)
    documents = make_documents()
    samples = score(load_model(), ordered_samples(documents))
    tokens = sum(s["tokens"] for s in samples)
    lm_loss = sum(s["loss_sum"] for s in samples) / tokens
    golden = {
        "seq_length": SEQ_LENGTH,
        "split": "all",
        "documents": documents,
        "samples": samples,
        "tokens": tokens,
        "lm_loss": lm_loss,
        "ppl": math.exp(lm_loss),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    path = os.path.join(args.out, "golden.json")
    with open(path, "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    print(f"{path}: {len(samples)} samples, {tokens} tokens, lm loss {lm_loss:.6f}")


if __name__ == "__main__":
    main()
