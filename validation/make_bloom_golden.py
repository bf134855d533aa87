#!/usr/bin/env python3
"""Golden reference for meshtron's BLOOM family: a tiny Hugging Face
BloomForCausalLM trained for 3 AdamW steps on CPU in float32, with every
number meshtron must reproduce written to safetensors, and a sharded copy of
the same model for the index reader.

How to rerun
------------
Needs python3 with torch, transformers, safetensors, numpy. Runs on CPU in
a few seconds; no GPU is used.

    cd validation
    python3 make_bloom_golden.py --out bloom-golden --sharded-out bloom-golden-sharded

Where torch is not installed, run it on any machine that has the four
packages, writing to a scratch folder, and copy the outputs back:

    python3 make_bloom_golden.py --out /tmp/bloom-golden --sharded-out /tmp/bloom-golden-sharded
    mkdir -p validation/bloom-golden validation/bloom-golden-sharded
    cp /tmp/bloom-golden/*.json /tmp/bloom-golden/*.safetensors validation/bloom-golden/
    cp /tmp/bloom-golden-sharded/*.json /tmp/bloom-golden-sharded/*.safetensors \\
       validation/bloom-golden-sharded/

Outputs (in --out)
------------------
config.json, generation_config.json, model.safetensors
    BloomForCausalLM.save_pretrained(safe_serialization=True) of the model
    *before* training: its random initialisation (torch.manual_seed(1234)),
    then every 1-d parameter (LayerNorm weights and biases, linear biases,
    all zeros or ones at initialisation) moved by 0.1 * N(0, 1) from a
    generator seeded with 1234, so that a misplaced bias or norm shows.
    BloomConfig(vocab_size=1000, hidden_size=96, n_layer=2, n_head=6
    (head_dim 16; 6 heads take ALiBi's interpolated slopes),
    layer_norm_epsilon=1e-5, hidden_dropout 0, attention_dropout 0,
    apply_residual_connection_post_layernorm=False, pretraining_tp=1,
    slow_but_exact=False, tie_word_embeddings=True, seq_length=64, eager
    attention). Linear weights are nn.Linear layout: [out_features,
    in_features]; query_key_value's rows are [heads, 3, head_dim]. The LM
    head is the word embedding (tied): no lm_head.weight is stored.

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
    lrs            [3]  learning rate used at 1-based step i (golden_training.lr_at):
                   max_lr=1e-3, min_lr=1e-4, warmup=2, decay_iters=4, cosine.
    grad.<name>    step-0 gradient of each parameter (raw, before clipping),
                   <name> being the HF parameter name
                   (transformer.word_embeddings.weight, which holds the tied
                   head's gradient too, transformer.h.N.self_attention.
                   query_key_value.weight, ...).
    final.<name>   parameter values after the 3 optimizer steps.

Outputs (in --sharded-out)
--------------------------
config.json, generation_config.json, model-0000k-of-0000n.safetensors,
model.safetensors.index.json
    The same initial model, save_pretrained(max_shard_size="200KB"): several
    shards and the index (weight_map) that names each tensor's shard.

Optimizer (golden_training.py): torch.optim.AdamW(betas=(0.9, 0.95),
eps=1e-8) with two groups: weight_decay 0.1 for parameters with ndim >= 2
(the word embedding and every linear weight), 0.0 for ndim == 1 (norms and
biases). Each step: forward, loss.backward(), clip_grad_norm_(1.0), set lr
in every group, optimizer.step(), optimizer.zero_grad().
"""
import torch
from transformers import BloomConfig, BloomForCausalLM

from golden_training import SEED, recipe_metadata, write_family_golden

VOCAB = 1000


def build_model():
    config = BloomConfig(vocab_size=VOCAB, hidden_size=96, n_layer=2, n_head=6,
                         layer_norm_epsilon=1e-5, hidden_dropout=0.0,
                         attention_dropout=0.0,
                         apply_residual_connection_post_layernorm=False,
                         pretraining_tp=1, slow_but_exact=False,
                         tie_word_embeddings=True, initializer_range=0.02,
                         seq_length=64, attn_implementation="eager")
    torch.manual_seed(SEED)
    model = BloomForCausalLM(config).float()
    model.config._attn_implementation = "eager"
    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn(p.shape, generator=generator))
    model.train()  # the dropouts are 0, so train mode is deterministic
    return model


def metadata(model):
    c = model.config
    return {
        "generator": "validation/make_bloom_golden.py",
        "seed": str(SEED),
        "model": (f"vocab_size={c.vocab_size} hidden_size={c.hidden_size} "
                  f"n_layer={c.n_layer} n_head={c.n_head} "
                  f"layer_norm_epsilon={c.layer_norm_epsilon} "
                  f"tie_word_embeddings={c.tie_word_embeddings} seq_length=64 "
                  "dropout=0 one_dim_params_moved_by=0.1*N(0,1)"),
        **recipe_metadata(),
    }


def main():
    write_family_golden(__doc__, "bloom", build_model, metadata, VOCAB)


if __name__ == "__main__":
    main()
