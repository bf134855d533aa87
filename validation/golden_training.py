"""The training recipe the golden generators record (make_gpt2_golden.py,
make_llama_golden.py, make_bloom_golden.py, make_gpt_neox_golden.py): the
hyper-parameters, the learning-rate schedule, AdamW with decay on matrices
only, and three recorded steps. Imported by the scripts beside it; needs
torch and safetensors."""
import argparse
import math
import os

import numpy as np
import safetensors
import torch
import torch.nn.functional as F
import transformers
from safetensors import safe_open
from safetensors.torch import save_file

SEED = 1234
STEPS, BATCH, SEQ = 3, 2, 16
MAX_LR, MIN_LR, WARMUP, DECAY_ITERS = 1e-3, 1e-4, 2, 4
BETAS, EPS, WEIGHT_DECAY, CLIP = (0.9, 0.95), 1e-8, 0.1, 1.0


def lr_at(step):
    """Learning rate of 1-based `step`: linear warmup then cosine decay."""
    if step <= WARMUP:
        return MAX_LR * step / WARMUP
    if step <= DECAY_ITERS:
        ratio = (step - WARMUP) / (DECAY_ITERS - WARMUP)
        return MIN_LR + 0.5 * (MAX_LR - MIN_LR) * (1 + math.cos(math.pi * ratio))
    return MIN_LR


def make_optimizer(model):
    params = list(model.named_parameters())  # tied wte listed once
    decay = [p for _, p in params if p.ndim >= 2]
    no_decay = [p for _, p in params if p.ndim < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": WEIGHT_DECAY},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=MAX_LR, betas=BETAS, eps=EPS)


def as_f32(t):
    return t.detach().to(torch.float32).contiguous().clone()


def train_and_record(model, tokens):
    optimizer = make_optimizer(model)
    out = {}
    losses, norms, lrs = [], [], []
    for k in range(STEPS):
        inputs, targets = tokens[k, :, :SEQ], tokens[k, :, 1:]
        logits = model(inputs).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                               targets.reshape(-1))
        loss.backward()
        if k == 0:
            out["logits"] = as_f32(logits)
            for name, p in model.named_parameters():
                out["grad." + name] = as_f32(p.grad)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=CLIP)
        lr = lr_at(k + 1)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        norms.append(norm.item())
        lrs.append(lr)
        print(f"step {k + 1}: loss {loss.item():.9g} grad_norm {norm.item():.9g} "
              f"lr {lr:.9g}")
    for name, p in model.named_parameters():
        out["final." + name] = as_f32(p)
    out["losses"] = torch.tensor(losses, dtype=torch.float32)
    out["grad_norms"] = torch.tensor(norms, dtype=torch.float32)
    out["lrs"] = torch.tensor(lrs, dtype=torch.float32)
    return out


def print_file_keys(path):
    with safe_open(path, framework="pt") as f:
        for key in sorted(f.keys()):
            t = f.get_slice(key)
            print(f"  {key} {t.get_dtype()} {list(t.get_shape())}")


def recipe_metadata():
    """The library versions and this recipe, for golden.safetensors' metadata."""
    return {
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "safetensors_version": safetensors.__version__,
        "numpy_version": np.__version__,
        "data": f"steps={STEPS} batch={BATCH} seq={SEQ}",
        "optimizer": (f"AdamW betas={BETAS} eps={EPS} weight_decay={WEIGHT_DECAY} "
                      "(ndim>=2; 0 for ndim==1) clip_grad_norm=1.0"),
        "lr_schedule": (f"max_lr={MAX_LR} min_lr={MIN_LR} warmup={WARMUP} "
                        f"decay_iters={DECAY_ITERS} linear warmup + cosine"),
    }


def list_folder(folder):
    for name in sorted(os.listdir(folder)):
        print(f"{folder}/{name}: {os.path.getsize(os.path.join(folder, name))} bytes")


def write_family_golden(doc, family, build_model, metadata, vocab, show_config=False):
    """A family script's command line: --out FAMILY-golden (the initial model
    and golden.safetensors of the recorded steps) and --sharded-out
    FAMILY-golden-sharded (the same model in 200 KB shards with its index)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", default=f"{family}-golden",
                        help="output folder (created if missing)")
    parser.add_argument("--sharded-out", default=f"{family}-golden-sharded",
                        help="folder of the sharded copy (created if missing)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.sharded_out, exist_ok=True)

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    print(f"torch {torch.__version__} transformers {transformers.__version__} "
          f"safetensors {safetensors.__version__}")

    model = build_model()
    model.save_pretrained(args.out, safe_serialization=True)
    model.save_pretrained(args.sharded_out, safe_serialization=True, max_shard_size="200KB")
    assert os.path.exists(os.path.join(args.sharded_out, "model.safetensors.index.json")), \
        "the sharded copy has no index: lower max_shard_size"
    if show_config:
        print("config.json:")
        with open(os.path.join(args.out, "config.json")) as f:
            print(f.read())
    print("model.safetensors keys:")
    print_file_keys(os.path.join(args.out, "model.safetensors"))
    print("named_parameters:", [n for n, _ in model.named_parameters()])

    generator = torch.Generator().manual_seed(SEED)
    tokens = torch.randint(0, vocab, (STEPS, BATCH, SEQ + 1), generator=generator)
    golden = train_and_record(model, tokens)
    golden["tokens"] = tokens.to(torch.int32).contiguous()

    golden_file = os.path.join(args.out, "golden.safetensors")
    save_file(golden, golden_file, metadata=metadata(model))
    print("losses", repr(golden["losses"].tolist()))
    print("grad_norms", repr(golden["grad_norms"].tolist()))
    print("lrs", repr(golden["lrs"].tolist()))
    list_folder(args.out)
    list_folder(args.sharded_out)
