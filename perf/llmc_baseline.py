"""llm.c baseline for meshtron's end-to-end throughput (issue 9).

Trains llm.c's `train_gpt2cu` (github.com/karpathy/llm.c, built by the
user: it is not part of meshtron and not in this repository) on the GPT-2
124M / 350M / 774M / 1.5B shapes (`-e d12 / d24 / d36 / d48`: random init, seq 1024,
bf16, micro-batch 8, one micro-batch per step by default, recompute off, fp32 master
weights as llm.c's default) on synthetic tokens written in llm.c's shard
format, and prints one JSON line per model with ms/step (the median of
llm.c's own per-step times after the warm-up), tokens/s/GPU, TFLOP/s/GPU
and MFU with the same model-FLOPs formula as perf/e2e_gpu.py.

    python3 perf/llmc_baseline.py --binary /path/to/llm.c/train_gpt2cu --models 124m 350m 774m
    python3 perf/e2e_gpu.py ... --llmc /path/to/llm.c/train_gpt2cu   # beside meshtron, with the ratio

Building llm.c: `make train_gpt2cu` in its checkout (add USE_CUDNN=1 with
cuDNN and its frontend headers for its flash-attention path; without them
llm.c materialises the attention matrix). Say which in any quoted number.
Runs on the GPU node; never part of meshtron itself.
"""
import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from array import array

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_gpu import SEQ, machine, report  # noqa: E402 (the same row, FLOPs formula and peak as meshtron's)

DESCRIPTORS = {"124m": "d12", "350m": "d24", "774m": "d36", "1.5b": "d48"}
STEP_LINE = re.compile(r"step\s+(\d+)/\d+ \|.*\|\s*([0-9.]+) ms \|")
SHARD_MAGIC, SHARD_VERSION = 20240520, 1  # llm.c's dataloader.h: 256 int32 header, then uint16 tokens


def write_shard(path, tokens):
    header = array("i", [SHARD_MAGIC, SHARD_VERSION, len(tokens)] + [0] * 253)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(array("H", tokens).tobytes())


def synthetic_shards(folder, train_tokens=4 << 20, val_tokens=1 << 18, seed=1234):
    """Random GPT-2 token ids (throughput does not depend on them)."""
    rng = random.Random(seed)
    train, val = os.path.join(folder, "synthetic_train.bin"), os.path.join(folder, "synthetic_val.bin")
    write_shard(train, [rng.randrange(50257) for _ in range(train_tokens)])
    write_shard(val, [rng.randrange(50257) for _ in range(val_tokens)])
    return train, val


def run(binary, name, micro_batch, steps, warmup, accumulate=1, extra=()):
    """One optimizer step = `accumulate` micro-batches (llm.c's -d, tokens per step)."""
    folder = tempfile.mkdtemp(prefix="llmc_")
    try:
        train, val = synthetic_shards(folder)
        cmd = [binary, "-i", train, "-j", val, "-e", DESCRIPTORS[name], "-b", str(micro_batch),
               "-t", str(SEQ), "-d", str(accumulate * micro_batch * SEQ), "-x", str(steps + warmup),
               "-v", "1000000", "-s", "1000000", "-n", "0", "-r", "0", "-z", "0", *extra]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    times = {int(m.group(1)): float(m.group(2)) for m in map(STEP_LINE.search, proc.stdout.splitlines()) if m}
    timed = [ms for step, ms in sorted(times.items()) if step > warmup]
    if proc.returncode != 0 or not timed:
        print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
        return None
    command = " ".join(os.path.basename(c) if c in (train, val) else c for c in cmd)
    return report(name, "llm.c", micro_batch, 1, statistics.median(timed),
                  {"steps_timed": len(timed), "command": command}, accumulate=accumulate)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True, help="llm.c's train_gpt2cu")
    parser.add_argument("--models", nargs="+", default=["124m", "350m", "774m"])
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--extra", default="", help="more llm.c flags, e.g. '-ge 1'")
    args = parser.parse_args()
    print(json.dumps(machine()), flush=True)
    for name in args.models:
        run(args.binary, name, args.micro_batch, args.steps, args.warmup, extra=args.extra.split())
