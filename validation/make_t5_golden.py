#!/usr/bin/env python3
"""Golden reference for meshtron's T5: two tiny random Hugging Face
T5ForConditionalGeneration models in float32 (T5 v1.0-style and v1.1 / mT5
style), one forward and backward on fixed inputs with padding, and greedy and
beam generation, with every number meshtron must reproduce written to
safetensors and JSON.

How to rerun
------------
Needs python3 with torch, transformers, safetensors. Runs on CPU in a few
seconds; no GPU is used.

    cd validation
    python3 make_t5_golden.py --out t5-golden

Where torch is not installed, run it on a machine that has the packages,
writing to a scratch folder, and copy the outputs back:

    python3 make_t5_golden.py --out /tmp/t5-golden
    mkdir -p validation/t5-golden
    cp -r /tmp/t5-golden/v1_0 /tmp/t5-golden/v1_1 validation/t5-golden/

Outputs (one folder per model in --out)
---------------------------------------
v1_0/   T5 v1.0 style: feed_forward_proj "relu", tie_word_embeddings true
        (the head is the shared table, the decoder output scaled by
        d_model ** -0.5), 2 encoder and 2 decoder layers.
v1_1/   T5 v1.1 / mT5 style: feed_forward_proj "gated-gelu" (gelu_new),
        tie_word_embeddings false (its own lm_head), 2 encoder and 3 decoder
        layers (num_decoder_layers != num_layers).
Both: vocab_size 100, d_model 32, d_kv 8, num_heads 4 (inner 32), d_ff 64,
relative_attention_num_buckets 8, relative_attention_max_distance 16 (the
sequences below are longer than 16, so the logarithmic buckets and the
clamped last bucket are all used), layer_norm_epsilon 1e-6, dropout 0,
eager attention, pad 0, eos 1, decoder start 0. After transformers'
initialisation every parameter is redrawn (seed 1234): norm weights
1 + N(0, 0.1), relative_attention_bias N(0, 1) (so a wrong bucket shows),
every other N(0, 0.1).

Each folder holds
config.json, generation_config.json, model.safetensors
    save_pretrained(safe_serialization=True) of the model.
golden.safetensors (float32 unless noted; metadata names the versions)
    input_ids            int32 [2, 20]  torch.randint(2, 100), seed 1234;
                         sample 1's last 5 tokens are padding (id 0).
    attention_mask       int32 [2, 20]  1 real, 0 padding.
    decoder_input_ids    int32 [2, 18]  labels shifted right, 0 first
                         (decoder_start_token_id), -100 -> 0 (pad).
    labels               int32 [2, 18]  randint(2, 100), seed 1234; -100 at
                         sample 0's position 5 and sample 1's last 4.
    logits               [2, 18, 100]   T5ForConditionalGeneration's logits.
    loss                 [1]  cross-entropy, mean over the labelled tokens.
    grad.<name>          d(loss)/d(parameter) for every parameter of
                         named_parameters() (the shared table once, as
                         shared.weight; lm_head.weight in v1_1 only).
generate.json
    {"input_ids": [[...], [...]], "attention_mask": [[...], [...]],
     "max_new_tokens": 8, "num_beams": 3, "length_penalty": 1.0,
     "early_stopping": false, "decoder_start_token_id": 0,
     "eos_token_id": 1, "pad_token_id": 0,
     "greedy": [[ids], [ids]], "beam": [[ids], [ids]],
     "greedy_min_margin": float, "versions": {...}}
    The encoder inputs are golden.safetensors' input_ids and attention_mask
    (the padded batch of two, generated together). greedy: generate(
    do_sample=False, num_beams=1); beam: generate(do_sample=False,
    num_beams=3, length_penalty=1.0, early_stopping=False). Ids are the
    generated tokens only (the decoder start token removed); a sequence that
    produced eos (1) before max_new_tokens is followed by pad (0), as
    transformers returns the batch, and the rows are shorter than
    max_new_tokens when every sequence of the batch ended early. greedy_min_margin is the smallest gap
    between the best and second-best log-probability over the greedy steps
    (a tie-break closer than rounding would make the ids fragile).

tests/validation/test_t5_golden.cpp compares meshtron with these on 1 rank
and tp 2.
"""
import argparse
import json
import os

import safetensors
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file
from transformers import T5Config, T5ForConditionalGeneration

SEED = 1234
BATCH, ENC_SEQ, DEC_SEQ, VOCAB = 2, 20, 18, 100
ENC_PADDING = 5  # padding tokens at the end of encoder sample 1
MAX_NEW_TOKENS, NUM_BEAMS = 8, 3
PAD, EOS, DECODER_START = 0, 1, 0

MODELS = {
    "v1_0": dict(feed_forward_proj="relu", tie_word_embeddings=True, num_decoder_layers=2),
    "v1_1": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False, num_decoder_layers=3),
}


def build_model(feed_forward_proj, tie_word_embeddings, num_decoder_layers):
    config = T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                      num_decoder_layers=num_decoder_layers, num_heads=4,
                      relative_attention_num_buckets=8, relative_attention_max_distance=16,
                      dropout_rate=0.0, layer_norm_epsilon=1e-6, initializer_factor=1.0,
                      feed_forward_proj=feed_forward_proj,
                      tie_word_embeddings=tie_word_embeddings, pad_token_id=PAD,
                      eos_token_id=EOS, decoder_start_token_id=DECODER_START,
                      attn_implementation="eager")
    torch.manual_seed(SEED)
    model = T5ForConditionalGeneration(config).float()
    model.config._attn_implementation = "eager"
    if not tie_word_embeddings and model.lm_head.weight is model.shared.weight:
        # transformers 5.17 built this v1.1 model with its head tied to the
        # shared table although the config says untied; give the head its
        # own parameter, as loading a v1.1 checkpoint does.
        print("untying lm_head from shared.weight (tied at construction)")
        model.lm_head.weight = torch.nn.Parameter(model.shared.weight.detach().clone())
    model.config.tie_word_embeddings = tie_word_embeddings
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape)
            if "layer_norm" in name:
                p.copy_(1.0 + 0.1 * noise)
            elif "relative_attention_bias" in name:
                p.copy_(noise)
            else:
                p.copy_(0.1 * noise)
    model.eval()  # dropout is 0 either way
    names = [n for n, _ in model.named_parameters()]
    assert "shared.weight" in names, names
    # encoder/decoder.embed_tokens are the shared table itself (listed once).
    assert not any("embed_tokens" in n for n in names), names
    assert ("lm_head.weight" in names) == (not tie_word_embeddings), names
    return model


def inputs():
    generator = torch.Generator().manual_seed(SEED)
    input_ids = torch.randint(2, VOCAB, (BATCH, ENC_SEQ), generator=generator)
    attention_mask = torch.ones(BATCH, ENC_SEQ, dtype=torch.long)
    attention_mask[1, ENC_SEQ - ENC_PADDING:] = 0
    input_ids[1, ENC_SEQ - ENC_PADDING:] = PAD
    labels = torch.randint(2, VOCAB, (BATCH, DEC_SEQ), generator=generator)
    labels[0, 5] = -100
    labels[1, DEC_SEQ - 4:] = -100
    # transformers' _shift_right: start token first, -100 -> pad.
    decoder_input_ids = torch.full((BATCH, DEC_SEQ), DECODER_START, dtype=torch.long)
    decoder_input_ids[:, 1:] = labels[:, :-1]
    decoder_input_ids[decoder_input_ids == -100] = PAD
    return dict(input_ids=input_ids, attention_mask=attention_mask,
                decoder_input_ids=decoder_input_ids, labels=labels)


def forward_backward(model, batch):
    """The golden tensors of one forward and backward. The loss recorded and
    differentiated is the cross-entropy written out (T5_DESIGN's definition);
    a differing out.loss is reported, not recorded."""
    out = model(**batch, return_dict=True)
    logits = out.logits
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch["labels"].reshape(-1),
                           ignore_index=-100)
    if not torch.allclose(loss, out.loss, rtol=1e-6, atol=0):
        print(f"WARNING: transformers' loss {out.loss.item()!r} differs from the "
              f"cross-entropy over labelled tokens {loss.item()!r}")
    loss.backward()
    golden = {k: v.to(torch.int32).contiguous() for k, v in batch.items()}
    golden["logits"] = logits.detach().contiguous()
    golden["loss"] = loss.detach().reshape(1).contiguous()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        golden["grad." + name] = p.grad.detach().contiguous()
    model.zero_grad(set_to_none=True)
    return golden


def generate(model, batch, num_beams):
    """Generated ids (the start token removed) and the per-step scores."""
    beam_only = dict(length_penalty=1.0, early_stopping=False) if num_beams > 1 else {}
    with torch.no_grad():
        out = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                             max_new_tokens=MAX_NEW_TOKENS, do_sample=False, num_beams=num_beams,
                             decoder_start_token_id=DECODER_START, eos_token_id=EOS,
                             pad_token_id=PAD, output_scores=True, return_dict_in_generate=True,
                             **beam_only)
    ids = out.sequences
    assert bool((ids[:, 0] == DECODER_START).all()), ids
    return ids[:, 1:].tolist(), out.scores


def min_margin(scores):
    """Smallest gap between the two best log-probabilities over the steps."""
    gaps = [(s.log_softmax(-1).topk(2, dim=-1).values.diff(dim=-1).abs()).min().item()
            for s in scores]
    return min(gaps)


def write_model_folder(folder, spec, versions):
    os.makedirs(folder, exist_ok=True)
    model = build_model(**spec)
    model.save_pretrained(folder, safe_serialization=True)
    batch = inputs()
    golden = forward_backward(model, batch)
    save_file(golden, os.path.join(folder, "golden.safetensors"),
              metadata={"generator": "validation/make_t5_golden.py", "versions": versions,
                        "seed": str(SEED)})
    greedy, greedy_scores = generate(model, batch, 1)
    beam, _ = generate(model, batch, NUM_BEAMS)
    expected = {
        "input_ids": batch["input_ids"].tolist(),
        "attention_mask": batch["attention_mask"].tolist(),
        "max_new_tokens": MAX_NEW_TOKENS,
        "num_beams": NUM_BEAMS,
        "length_penalty": 1.0,
        "early_stopping": False,
        "decoder_start_token_id": DECODER_START,
        "eos_token_id": EOS,
        "pad_token_id": PAD,
        "greedy": greedy,
        "beam": beam,
        "greedy_min_margin": min_margin(greedy_scores),
        "versions": versions,
    }
    with open(os.path.join(folder, "generate.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")
    print(folder, "loss", golden["loss"].item())
    print(folder, "greedy", greedy, "beam", beam, "greedy_min_margin",
          expected["greedy_min_margin"])
    print(folder, "gradients:", sorted(k for k in golden if k.startswith("grad.")))
    for name in sorted(os.listdir(folder)):
        print(f"{folder}/{name}: {os.path.getsize(os.path.join(folder, name))} bytes")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="t5-golden", help="output folder (created if missing)")
    args = parser.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    versions = (f"torch {torch.__version__} transformers {transformers.__version__} "
                f"safetensors {safetensors.__version__}")
    print(versions)
    for name, spec in MODELS.items():
        write_model_folder(os.path.join(args.out, name), spec, versions)


if __name__ == "__main__":
    main()
