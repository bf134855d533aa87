"""The training recipe the golden generators record (make_gpt2_golden.py,
make_llama_golden.py, make_bloom_golden.py, make_gpt_neox_golden.py): the
hyper-parameters, the learning-rate schedule, AdamW with decay on matrices
only, and three recorded steps. Imported by the scripts beside it; needs
torch and safetensors."""
import math

import numpy as np
import safetensors
import torch
import torch.nn.functional as F
import transformers
from safetensors import safe_open

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
