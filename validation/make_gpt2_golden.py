#!/usr/bin/env python3
"""Golden reference for meshtron's GPT-2: a tiny Hugging Face GPT2LMHeadModel
trained for 3 AdamW steps on CPU in float32, with every number meshtron must
reproduce written to safetensors.

How to rerun
------------
Needs python3 with torch, transformers (5.x was used), safetensors, numpy.
Runs on CPU in a few seconds; no GPU is used.

    cd validation
    python3 make_gpt2_golden.py --out gpt2-golden

Where torch is not installed, run it on any machine that has the four
packages, writing to a scratch folder, and copy the outputs back:

    python3 make_gpt2_golden.py --out /tmp/gpt2-golden
    cp /tmp/gpt2-golden/*.json /tmp/gpt2-golden/*.safetensors validation/gpt2-golden/

Outputs (in --out)
------------------
config.json, generation_config.json, model.safetensors
    GPT2LMHeadModel.save_pretrained(safe_serialization=True) of the model
    *before* training (its random initialisation, torch.manual_seed(1234)).
    GPT2Config(vocab_size=1000, n_positions=32, n_embd=64, n_layer=2,
    n_head=4, all dropouts 0, layer_norm_epsilon=1e-5, gelu_new, eager
    attention). Linear weights are HF Conv1D layout: [in_features,
    out_features]. lm_head.weight is tied to transformer.wte.weight.

golden.safetensors (float32 unless noted; metadata holds the versions and
every hyper-parameter below as strings)
    tokens         int32 [3, 2, 17]  torch.randint(0, 1000) from a generator
                   seeded with 1234. Step k (0-based) uses input
                   tokens[k, :, :16] and targets tokens[k, :, 1:].
    logits         [2, 16, 1000]  step-0 logits of the initial model.
    losses         [3]  mean cross-entropy over all 2*16 targets, per step,
                   computed before that step's update.
    grad_norms     [3]  global L2 norm of all gradients (tied wte counted
                   once) before clipping, as clip_grad_norm_ returns it.
                   Gradients are then clipped to max_norm 1.0.
    lrs            [3]  learning rate used at 1-based step i:
                   i <= warmup:       max_lr * i / warmup
                   i <= decay_iters:  min_lr + 0.5*(max_lr-min_lr)*
                                      (1+cos(pi*(i-warmup)/(decay_iters-warmup)))
                   else:              min_lr
                   max_lr=1e-3, min_lr=1e-4, warmup=2, decay_iters=4.
    grad.<name>    step-0 gradient of each parameter (raw, before clipping),
                   <name> being the HF parameter name (tied wte appears once,
                   as transformer.wte.weight; no lm_head entry).
    final.<name>   parameter values after the 3 optimizer steps.

Optimizer: torch.optim.AdamW(betas=(0.9, 0.95), eps=1e-8) with two groups:
weight_decay 0.1 for parameters with ndim >= 2 (wte, wpe and every Conv1D
weight), 0.0 for ndim == 1 (biases, layer-norm weights and biases).
Each step: forward, loss.backward(), clip_grad_norm_(1.0), set lr in every
group, optimizer.step(), optimizer.zero_grad().
"""
import argparse
import os

import safetensors
import torch
import transformers
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel

from golden_training import (BATCH, SEED, SEQ, STEPS, print_file_keys, recipe_metadata,
                              train_and_record)


def build_model():
    config = GPT2Config(vocab_size=1000, n_positions=32, n_embd=64, n_layer=2,
                        n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0, layer_norm_epsilon=1e-5,
                        activation_function="gelu_new",
                        attn_implementation="eager")
    torch.manual_seed(SEED)
    model = GPT2LMHeadModel(config).float()
    model.config._attn_implementation = "eager"
    model.train()  # dropouts are 0, so train mode is deterministic
    return model


def metadata(model):
    c = model.config
    return {
        "generator": "validation/make_gpt2_golden.py",
        "seed": str(SEED),
        "model": (f"vocab_size={c.vocab_size} n_positions={c.n_positions} "
                  f"n_embd={c.n_embd} n_layer={c.n_layer} n_head={c.n_head} "
                  f"layer_norm_epsilon={c.layer_norm_epsilon} "
                  f"activation_function={c.activation_function} dropout=0"),
        **recipe_metadata(),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpt2-golden",
                        help="output folder (created if missing)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    print(f"torch {torch.__version__} transformers {transformers.__version__} "
          f"safetensors {safetensors.__version__}")

    model = build_model()
    model.save_pretrained(args.out, safe_serialization=True)
    model_file = os.path.join(args.out, "model.safetensors")
    print("model.safetensors keys:")
    print_file_keys(model_file)
    print("named_parameters:", [n for n, _ in model.named_parameters()])

    generator = torch.Generator().manual_seed(SEED)
    tokens = torch.randint(0, 1000, (STEPS, BATCH, SEQ + 1), generator=generator)
    golden = train_and_record(model, tokens)
    golden["tokens"] = tokens.to(torch.int32).contiguous()

    golden_file = os.path.join(args.out, "golden.safetensors")
    save_file(golden, golden_file, metadata=metadata(model))
    print("losses", repr(golden["losses"].tolist()))
    print("grad_norms", repr(golden["grad_norms"].tolist()))
    print("lrs", repr(golden["lrs"].tolist()))
    for name in sorted(os.listdir(args.out)):
        print(f"{name}: {os.path.getsize(os.path.join(args.out, name))} bytes")


if __name__ == "__main__":
    main()
