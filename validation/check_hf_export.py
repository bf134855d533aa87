"""Check that a model exported by `meshtron convert` loads in transformers
unchanged and gives the golden logits.

    meshtron convert --from hf validation/gpt2-golden --to /tmp/ckpt
    meshtron convert --from /tmp/ckpt/iter_0000000.h5 --to hf validation/gpt2-golden-export
    python3 validation/check_hf_export.py [--out DIR]

Needs torch, transformers and safetensors (the GPU node has them; CPU is
fine). Loads validation/gpt2-golden-export with GPT2LMHeadModel.from_pretrained,
runs the golden step-1 tokens, compares the logits with golden.safetensors,
and writes the verdict to validation/gpt2-golden-export/transformers_check.txt
(or DIR/transformers_check.txt).
"""
import argparse
import os

import torch
import transformers
from safetensors.torch import load_file

here = os.path.dirname(os.path.abspath(__file__))
parser = argparse.ArgumentParser()
parser.add_argument("--out", default=os.path.join(here, "gpt2-golden-export"))
args = parser.parse_args()

model = transformers.GPT2LMHeadModel.from_pretrained(
    os.path.join(here, "gpt2-golden-export"), attn_implementation="eager").eval()
golden = load_file(os.path.join(here, "gpt2-golden", "golden.safetensors"))
tokens = golden["tokens"][0, :, :16].long()
with torch.no_grad():
    logits = model(tokens).logits
diff = (logits - golden["logits"]).abs().max().item()
scale = golden["logits"].abs().max().item()
verdict = "PASS" if diff / scale <= 1e-6 else "FAIL"
text = (f"{verdict}: max |logits - golden| / max |golden| = {diff / scale:.3e} "
        f"(torch {torch.__version__}, transformers {transformers.__version__})\n")
print(text, end="")
os.makedirs(args.out, exist_ok=True)
with open(os.path.join(args.out, "transformers_check.txt"), "w") as f:
    f.write(text)
