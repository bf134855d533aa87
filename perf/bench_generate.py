"""Decode throughput of `meshtron generate` on one GPU against transformers'
`generate` (static cache, torch.compile), in one run (issue 64's benchmark).

For each model (GPT-2 124M / 774M shapes, random weights: a transformers
GPT2LMHeadModel of that shape saved to a temporary folder and converted with
`meshtron convert --from hf`) and each batch size (1, 32): prompts of
--prompt random ids, --new new tokens, greedy, nothing stops a sequence early.
Both frameworks run the same prompts in the same dtype (--precision).

Decode tokens/s = batch x (new - 1) / (time of a generate with --new tokens
less that of a generate with 1 token): the prefill and the first token fall
out of the difference. Each timed generate follows a warm-up of the same
shape (meshtron: the prompts file holds the batch twice, and its second
batch's time is taken from the " > batch 2: ... in S s" line).

    python3 perf/bench_generate.py --meshtron build-gpu/meshtron
    python3 perf/bench_generate.py --meshtron build-gpu/meshtron --models 124m --batches 1 --no-torch

Prints one JSON line per (model, batch, framework) and one ratio line per
(model, batch): meshtron / transformers decode tokens/s (the issue's target
is >= 2). Runs on the GPU node; transformers is the baseline here, never
part of meshtron.
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_gpu import SHAPES, machine  # noqa: E402 (the shapes and the machine line of perf/RESULTS.md)

VOCAB = 50257  # GPT-2's own vocabulary (meshtron pads it)
POSITIONS = 1024
BATCH_LINE = re.compile(r" > batch (\d+): (\d+) prompts, (\d+) new tokens in ([0-9.eE+-]+) s")


def save_hf_model(name, folder, seed):
    """A random GPT2LMHeadModel of the shape `name` in `folder` (safetensors)."""
    import torch
    import transformers
    layers, hidden, heads = SHAPES[name]
    torch.manual_seed(seed)
    config = transformers.GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads,
                                     n_positions=POSITIONS, vocab_size=VOCAB)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder, safe_serialization=True)


def prompts_of(batch, length, seed):
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(length)] for _ in range(batch)]


def meshtron_seconds(binary, checkpoint, prompts, new_tokens, precision, work):
    """Seconds and new tokens of meshtron's second (warm) batch of `prompts`."""
    prompt_file = os.path.join(work, "prompts.jsonl")
    with open(prompt_file, "w") as f:
        for p in prompts + prompts:  # batch 1 warms up, batch 2 is timed
            f.write(json.dumps({"ids": p}) + "\n")
    cmd = [binary, "generate", os.path.join(checkpoint, "model.deck"),
           "--set", "checkpoint.load=" + os.path.join(checkpoint, "iter_0000000.h5"),
           "--set", "run.device=cuda", "--set", "training.precision=" + precision,
           "--set", "run.output_dir=" + os.path.join(work, "runs"),
           "--set", "generate.prompts=" + prompt_file,
           "--set", "generate.output=" + os.path.join(work, "out.jsonl"),
           "--set", "generate.batch_size=%d" % len(prompts),
           "--set", "generate.max_new_tokens=%d" % new_tokens,
           "--set", "generate.decoding=greedy", "--set", "generate.stop_ids="]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit("meshtron generate failed:\n" + " ".join(cmd) + "\n" + run.stdout + run.stderr)
    batches = [m.groups() for m in BATCH_LINE.finditer(run.stdout)]
    if len(batches) != 2:
        sys.exit("no timed second batch in meshtron's output:\n" + run.stdout)
    return float(batches[-1][3]), int(batches[-1][2])


class TorchGenerate:
    """transformers' generate for one model: static cache and torch.compile
    (transformers' recipe), falling back to the dynamic cache (said in the
    row) where the installed version has no static cache for GPT-2."""

    def __init__(self, folder, precision):
        import torch
        import transformers
        self.torch = torch
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[precision]
        self.model = transformers.GPT2LMHeadModel.from_pretrained(folder, torch_dtype=dtype).cuda().eval()
        self.model.generation_config.pad_token_id = self.model.config.eos_token_id
        # Each (batch, cache length) is its own graph: room for all of them.
        torch._dynamo.config.cache_size_limit = 64
        self.eager_forward = self.model.forward
        self.model.forward = torch.compile(self.model.forward, mode="reduce-overhead", fullgraph=True)
        self.cache, self.compile = "static", "reduce-overhead"

    def _generate(self, ids, new_tokens):
        kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                      attention_mask=self.torch.ones_like(ids))
        if self.cache == "static":
            try:
                return self.model.generate(ids, cache_implementation="static", **kwargs)
            except Exception as e:  # noqa: BLE001 (said, and the row says which path ran)
                print("transformers: static cache + torch.compile failed (%s: %s); "
                      "dynamic cache, eager" % (type(e).__name__, e), file=sys.stderr)
                self.model.forward = self.eager_forward
                self.cache, self.compile = "dynamic", "none"
        return self.model.generate(ids, **kwargs)

    def seconds(self, prompts, new_tokens, warmups=2):
        torch = self.torch
        ids = torch.tensor(prompts, dtype=torch.long, device="cuda")
        with torch.inference_mode():
            for _ in range(warmups):  # compile and capture this shape first
                self._generate(ids, new_tokens)
            torch.cuda.synchronize()
            start = time.perf_counter()
            out = self._generate(ids, new_tokens)
            torch.cuda.synchronize()
        return time.perf_counter() - start, int((out.shape[1] - ids.shape[1]) * ids.shape[0])


def row(name, batch, framework, full, one, args, extra=None):
    """Rates from a generate of --new tokens (full) and of 1 token (one):
    (seconds, new tokens) each."""
    decode_s, decode_tokens = full[0] - one[0], full[1] - one[1]
    r = {"model": name, "batch": batch, "framework": framework, "prompt": args.prompt,
         "new_tokens": args.new, "precision": args.precision,
         "generate_s": round(full[0], 4), "prefill_s": round(one[0], 4),
         "decode_tokens_per_s": round(decode_tokens / decode_s, 1) if decode_s > 0 else None,
         "ms_per_decode_step": round(1e3 * decode_s / max(1, args.new - 1), 3),
         "generate_tokens_per_s": round(full[1] / full[0], 1)}
    r.update(extra or {})
    print(json.dumps(r), flush=True)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--meshtron", default="build-gpu/meshtron")
    ap.add_argument("--models", nargs="+", default=["124m", "774m"], choices=sorted(SHAPES))
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 32])
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--no-torch", action="store_true", help="meshtron only")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    if args.new < 2 or args.prompt + args.new > POSITIONS:
        sys.exit("--new must be at least 2 and --prompt + --new at most %d" % POSITIONS)
    print(json.dumps(machine()), flush=True)
    for name in args.models:
        if name not in ("124m", "350m", "774m", "1.5b"):
            sys.exit("bench_generate.py runs the GPT-2 shapes, not " + name)
        with tempfile.TemporaryDirectory(prefix="bench_generate_") as work:
            hf, ckpt = os.path.join(work, "hf"), os.path.join(work, "ckpt")
            save_hf_model(name, hf, args.seed)
            subprocess.run([args.meshtron, "convert", "--from", "hf", hf, "--to", ckpt], check=True,
                           stdout=subprocess.DEVNULL)
            baseline = None if args.no_torch else TorchGenerate(hf, args.precision)
            for batch in args.batches:
                prompts = prompts_of(batch, args.prompt, args.seed + batch)
                full = meshtron_seconds(args.meshtron, ckpt, prompts, args.new, args.precision, work)
                one = meshtron_seconds(args.meshtron, ckpt, prompts, 1, args.precision, work)
                mine = row(name, batch, "meshtron", full, one, args)
                if baseline is None:
                    continue
                full = baseline.seconds(prompts, args.new)
                one = baseline.seconds(prompts, 1)
                theirs = row(name, batch, "transformers", full, one, args,
                             {"cache": baseline.cache, "compile": baseline.compile})
                if mine["decode_tokens_per_s"] and theirs["decode_tokens_per_s"]:
                    print(json.dumps({"model": name, "batch": batch,
                                      "ratio_decode_meshtron_over_transformers": round(
                                          mine["decode_tokens_per_s"] / theirs["decode_tokens_per_s"], 2)}),
                          flush=True)


if __name__ == "__main__":
    main()
