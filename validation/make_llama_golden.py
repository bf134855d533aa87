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
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from golden_training import SEED, recipe_metadata, write_family_golden

VOCAB = 1000


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


def metadata(model):
    c = model.config
    return {
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
        **recipe_metadata(),
    }


def main():
    write_family_golden(__doc__, "llama", build_model, metadata, VOCAB)


if __name__ == "__main__":
    main()
