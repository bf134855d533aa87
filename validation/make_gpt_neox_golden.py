#!/usr/bin/env python3
"""Golden reference for meshtron's GPT-NeoX family: a tiny Hugging Face
GPTNeoXForCausalLM trained for 3 AdamW steps on CPU in float32, with every
number meshtron must reproduce written to safetensors, and a sharded copy of
the same model for the index reader.

How to rerun
------------
Needs python3 with torch, transformers, safetensors, numpy. Runs on CPU in a
few seconds; no GPU is used.

    cd validation
    python3 make_gpt_neox_golden.py --out gpt-neox-golden \\
        --sharded-out gpt-neox-golden-sharded

Where torch is not installed, run it on any machine that has the four
packages, writing to a scratch folder, and copy the outputs back:

    python3 make_gpt_neox_golden.py --out /tmp/gpt-neox-golden \\
        --sharded-out /tmp/gpt-neox-golden-sharded
    mkdir -p validation/gpt-neox-golden validation/gpt-neox-golden-sharded
    cp /tmp/gpt-neox-golden/*.json /tmp/gpt-neox-golden/*.safetensors \\
       validation/gpt-neox-golden/
    cp /tmp/gpt-neox-golden-sharded/*.json /tmp/gpt-neox-golden-sharded/*.safetensors \\
       validation/gpt-neox-golden-sharded/

Outputs (in --out)
------------------
config.json, generation_config.json, model.safetensors
    GPTNeoXForCausalLM.save_pretrained(safe_serialization=True) of the model
    *before* training: its random initialisation (torch.manual_seed(1234)),
    then every 1-D parameter (LayerNorm weights and biases, linear biases)
    moved by 0.1 * N(0, 1) from a generator seeded with 4321, so that the
    biases and norms are not the zeros and ones that would hide a misplaced
    element (query_key_value.bias is permuted on import).
    GPTNeoXConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2,
    num_attention_heads=4 (head_dim 16), intermediate_size=256,
    hidden_act "gelu" (the exact erf GeLU), rotary_pct=0.25 (4 of each
    head's 16 dims rotated, rotate_half over them), rotary_emb_base=10000,
    max_position_embeddings=64, layer_norm_eps=1e-5,
    use_parallel_residual=True, attention_bias=True, hidden and attention
    dropout 0, tie_word_embeddings=False, eager attention). Linear weights
    are nn.Linear layout: [out_features, in_features]; query_key_value's
    output rows are [heads, 3 (q, k, v), head_dim]. embed_out.weight is the
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
    lrs            [3]  learning rate of each step (golden_training.lr_at:
                   max_lr=1e-3, min_lr=1e-4, warmup=2, decay_iters=4, cosine).
    grad.<name>    step-0 gradient of each parameter (raw, before clipping),
                   <name> being the HF parameter name (gpt_neox.embed_in.weight,
                   gpt_neox.layers.N.attention.query_key_value.weight, ...,
                   embed_out.weight).
    final.<name>   parameter values after the 3 optimizer steps.

Outputs (in --sharded-out)
--------------------------
config.json, generation_config.json, model-0000k-of-0000n.safetensors,
model.safetensors.index.json
    The same initial model, save_pretrained(max_shard_size="200KB"): several
    shards and the index (weight_map) that names each tensor's shard.

Optimizer (golden_training.py, shared with the GPT-2 and Llama generators):
torch.optim.AdamW(betas=(0.9, 0.95), eps=1e-8) with weight_decay 0.1 for
parameters with ndim >= 2 (embed_in, embed_out and every linear weight), 0.0
for ndim == 1 (norms and biases). Each step: forward, loss.backward(),
clip_grad_norm_(1.0), set lr in every group, optimizer.step(),
optimizer.zero_grad().
"""
import torch
import transformers
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

from golden_training import SEED, recipe_metadata, write_family_golden

VOCAB = 1000
BIAS_SEED = 4321


def build_model():
    # rotary_pct and rotary_emb_base: transformers 4's keys, which
    # transformers 5 still reads (into rope_parameters).
    config = GPTNeoXConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                           num_attention_heads=4, intermediate_size=256, hidden_act="gelu",
                           rotary_pct=0.25, rotary_emb_base=10000,
                           max_position_embeddings=64, layer_norm_eps=1e-5,
                           use_parallel_residual=True, attention_bias=True,
                           hidden_dropout=0.0, attention_dropout=0.0,
                           tie_word_embeddings=False, initializer_range=0.02,
                           attn_implementation="eager")
    torch.manual_seed(SEED)
    model = GPTNeoXForCausalLM(config).float()
    model.config._attn_implementation = "eager"
    generator = torch.Generator().manual_seed(BIAS_SEED)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn(p.shape, generator=generator))
    model.train()  # every dropout is 0, so train mode is deterministic
    return model


def first_attribute(obj, names):
    for name in names:
        if getattr(obj, name, None) is not None:
            return getattr(obj, name)
    return None


def rotary_settings(c):
    """(rotary_pct, rope_theta) from whichever names the installed
    transformers keeps them under (rope_parameters in version 5)."""
    rope = getattr(c, "rope_parameters", None) or {}
    pct = rope.get("partial_rotary_factor",
                   first_attribute(c, ["partial_rotary_factor", "rotary_pct"]))
    theta = rope.get("rope_theta", first_attribute(c, ["rope_theta", "rotary_emb_base"]))
    return pct, theta


def metadata(model):
    c = model.config
    pct, theta = rotary_settings(c)
    assert pct == 0.25 and theta in (None, 10000, 10000.0), (pct, theta)
    return {
        "generator": "validation/make_gpt_neox_golden.py",
        "seed": str(SEED),
        "bias_seed": str(BIAS_SEED),
        "model": (f"vocab_size={c.vocab_size} hidden_size={c.hidden_size} "
                  f"intermediate_size={c.intermediate_size} "
                  f"num_hidden_layers={c.num_hidden_layers} "
                  f"num_attention_heads={c.num_attention_heads} "
                  f"rotary_pct={pct} rope_theta={theta} "
                  f"max_position_embeddings={c.max_position_embeddings} "
                  f"layer_norm_eps={c.layer_norm_eps} hidden_act={c.hidden_act} "
                  f"use_parallel_residual={c.use_parallel_residual} "
                  f"attention_bias={c.attention_bias} "
                  f"tie_word_embeddings={c.tie_word_embeddings} dropout=0"),
        **recipe_metadata(),
    }


def main():
    write_family_golden(__doc__, "gpt-neox", build_model, metadata, VOCAB, show_config=True)


if __name__ == "__main__":
    main()
