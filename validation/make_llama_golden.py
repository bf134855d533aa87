#!/usr/bin/env python3
"""Golden reference for meshtron's Llama family: a tiny Hugging Face
LlamaForCausalLM trained for 3 AdamW steps on CPU in float32, with every
number meshtron must reproduce written to safetensors, and a sharded copy of
the same model for the index reader.

How to rerun
------------
Needs python3 with torch, transformers (4.45 or later: head_dim in the
config), safetensors, numpy. Runs on CPU in a few seconds; no GPU is used.

    cd validation
    python3 make_llama_golden.py --out llama-golden --sharded-out llama-golden-sharded

Where torch is not installed, run it on any machine that has the four
packages, writing to a scratch folder, and copy the outputs back:

    python3 make_llama_golden.py --out /tmp/llama-golden --sharded-out /tmp/llama-golden-sharded
    mkdir -p validation/llama-golden validation/llama-golden-sharded
    cp /tmp/llama-golden/*.json /tmp/llama-golden/*.safetensors validation/llama-golden/
    cp /tmp/llama-golden-sharded/*.json /tmp/llama-golden-sharded/*.safetensors \\
       validation/llama-golden-sharded/

Outputs (in --out)
------------------
config.json, generation_config.json, model.safetensors
    LlamaForCausalLM.save_pretrained(safe_serialization=True) of the model
    *before* training (its random initialisation, torch.manual_seed(1234)).
    LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=176,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    (grouped-query attention, head_dim 16), max_position_embeddings=64,
    rms_norm_eps=1e-6, rope_theta=10000, no rope scaling, hidden_act silu,
    attention_bias=False, mlp_bias=False, attention_dropout 0,
    tie_word_embeddings=False, eager attention). Linear weights are
    nn.Linear layout: [out_features, in_features]. lm_head.weight is the
    model's own (untied).

golden.safetensors (float32 unless noted; metadata holds the versions and
every hyper-parameter below as strings)
    tokens         int32 [3, 2, 17]  torch.randint(0, 1000) from a generator
                   seeded with 1234. Step k (0-based) uses input
                   tokens[k, :, :16] and targets tokens[k, :, 1:].
    logits         [2, 16, 1000]  step-0 logits of the initial model.
    losses         [3]  mean cross-entropy over all 2*16 targets, per step,
                   computed before that step's update.
    grad_norms     [3]  global L2 norm of all gradients before clipping, as
                   clip_grad_norm_ returns it. Gradients are then clipped to
                   max_norm 1.0.
    lrs            [3]  learning rate used at 1-based step i:
                   i <= warmup:       max_lr * i / warmup
                   i <= decay_iters:  min_lr + 0.5*(max_lr-min_lr)*
                                      (1+cos(pi*(i-warmup)/(decay_iters-warmup)))
                   else:              min_lr
                   max_lr=1e-3, min_lr=1e-4, warmup=2, decay_iters=4.
    grad.<name>    step-0 gradient of each parameter (raw, before clipping),
                   <name> being the HF parameter name (model.embed_tokens.weight,
                   model.layers.N.self_attn.q_proj.weight, ..., lm_head.weight).
    final.<name>   parameter values after the 3 optimizer steps.

Outputs (in --sharded-out)
--------------------------
config.json, generation_config.json, model-0000k-of-0000n.safetensors,
model.safetensors.index.json
    The same initial model, save_pretrained(max_shard_size="200KB"): several
    shards and the index (weight_map) that names each tensor's shard.

Optimizer: torch.optim.AdamW(betas=(0.9, 0.95), eps=1e-8) with two groups:
weight_decay 0.1 for parameters with ndim >= 2 (embed_tokens, lm_head and
every linear weight), 0.0 for ndim == 1 (the RMSNorm weights).
Each step: forward, loss.backward(), clip_grad_norm_(1.0), set lr in every
group, optimizer.step(), optimizer.zero_grad().
"""
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
from transformers import LlamaConfig, LlamaForCausalLM

SEED = 1234
VOCAB = 1000
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


def build_model():
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=176,
                         num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16,
                         max_position_embeddings=64, rms_norm_eps=1e-6,
                         rope_theta=10000.0, rope_scaling=None, hidden_act="silu",
                         attention_bias=False, mlp_bias=False,
                         attention_dropout=0.0, tie_word_embeddings=False,
                         initializer_range=0.02,
                         attn_implementation="eager")
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).float()
    model.config._attn_implementation = "eager"
    model.train()  # attention_dropout is 0, so train mode is deterministic
    return model


def make_optimizer(model):
    params = list(model.named_parameters())
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


def metadata(model):
    c = model.config
    return {
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "safetensors_version": safetensors.__version__,
        "numpy_version": np.__version__,
        "generator": "validation/make_llama_golden.py",
        "seed": str(SEED),
        "model": (f"vocab_size={c.vocab_size} hidden_size={c.hidden_size} "
                  f"intermediate_size={c.intermediate_size} "
                  f"num_hidden_layers={c.num_hidden_layers} "
                  f"num_attention_heads={c.num_attention_heads} "
                  f"num_key_value_heads={c.num_key_value_heads} head_dim={c.head_dim} "
                  f"max_position_embeddings={c.max_position_embeddings} "
                  f"rms_norm_eps={c.rms_norm_eps} rope_theta=10000.0 "
                  f"hidden_act={c.hidden_act} tie_word_embeddings={c.tie_word_embeddings} "
                  "dropout=0"),
        "data": f"steps={STEPS} batch={BATCH} seq={SEQ}",
        "optimizer": (f"AdamW betas={BETAS} eps={EPS} weight_decay={WEIGHT_DECAY} "
                      "(ndim>=2; 0 for ndim==1) clip_grad_norm=1.0"),
        "lr_schedule": (f"max_lr={MAX_LR} min_lr={MIN_LR} warmup={WARMUP} "
                        f"decay_iters={DECAY_ITERS} linear warmup + cosine"),
    }


def print_file_keys(path):
    with safe_open(path, framework="pt") as f:
        for key in sorted(f.keys()):
            t = f.get_slice(key)
            print(f"  {key} {t.get_dtype()} {list(t.get_shape())}")


def list_folder(folder):
    for name in sorted(os.listdir(folder)):
        print(f"{folder}/{name}: {os.path.getsize(os.path.join(folder, name))} bytes")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="llama-golden",
                        help="output folder (created if missing)")
    parser.add_argument("--sharded-out", default="llama-golden-sharded",
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
    print("model.safetensors keys:")
    print_file_keys(os.path.join(args.out, "model.safetensors"))
    print("named_parameters:", [n for n, _ in model.named_parameters()])

    generator = torch.Generator().manual_seed(SEED)
    tokens = torch.randint(0, VOCAB, (STEPS, BATCH, SEQ + 1), generator=generator)
    golden = train_and_record(model, tokens)
    golden["tokens"] = tokens.to(torch.int32).contiguous()

    golden_file = os.path.join(args.out, "golden.safetensors")
    save_file(golden, golden_file, metadata=metadata(model))
    print("losses", repr(golden["losses"].tolist()))
    print("grad_norms", repr(golden["grad_norms"].tolist()))
    print("lrs", repr(golden["lrs"].tolist()))
    list_folder(args.out)
    list_folder(args.sharded_out)


if __name__ == "__main__":
    main()
