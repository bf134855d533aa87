"""PyTorch baseline for meshtron's end-to-end throughput (issue 9).

Trains Hugging Face GPT2LMHeadModel (GPT-2 124M / 350M / 774M / 1.5B shapes,
seq 1024), LlamaForCausalLM (llama-1b: TinyLlama-1.1B's shape, seq 2048),
MegatronBertForPreTraining (bert-large: Megatron's 345M BERT, seq 512, the
MLM + next-sentence loss on e2e_gpu's synthetic BERT batches) and
T5ForConditionalGeneration (t5-base, encoder 512 / decoder 128 tokens, the
cross-entropy over the labelled decoder tokens of e2e_gpu's synthetic T5
batches) on synthetic tokens the way a strong PyTorch user would: bf16
autocast, SDPA attention where the model has it, fused AdamW, torch.compile. Prints one JSON line
per model with tokens/s/GPU, ms/step, TFLOP/s/GPU and MFU, through
perf/e2e_gpu.py's report (the model-FLOPs formula meshtron prints, peak
989 TFLOP/s).

    python3 perf/torch_baseline.py --models 124m 350m 774m --steps 20 --warmup 5

Runs on the GPU node (torch + transformers); never part of meshtron itself.
"""
import argparse
import os
import sys
import time

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_gpu import BERT_VOCAB, LLAMA, SHAPES, T5, padded_vocab, report, seq_of  # noqa: E402 (the same shapes, FLOPs formula and peak as meshtron's)


def sdpa_or_eager(model_class, config_class, family, kwargs):
    """model_class(config_class(**kwargs)) with SDPA attention where this transformers has it
    for `family`, else with its eager attention (said on stderr)."""
    try:
        return model_class(config_class(attn_implementation="sdpa", **kwargs))
    except (ValueError, ImportError) as error:  # no SDPA for this family in this version
        print(f"{family}: no SDPA ({error}); eager attention", file=sys.stderr)
        return model_class(config_class(attn_implementation="eager", **kwargs))


def make_bert(name, dropout):
    """MegatronBertForPreTraining (pre-LN, learned positions, two token types,
    erf GeLU, the MLM head tied to the word table) with SDPA where this
    transformers has it for MegatronBert (else its eager attention; the
    row's "attention" names which ran)."""
    layers, hidden, heads = SHAPES[name]
    kwargs = dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                  intermediate_size=4 * hidden, max_position_embeddings=seq_of(name),
                  vocab_size=padded_vocab(name), type_vocab_size=2, hidden_act="gelu",
                  layer_norm_eps=1e-12, hidden_dropout_prob=dropout,
                  attention_probs_dropout_prob=dropout)
    return sdpa_or_eager(transformers.MegatronBertForPreTraining, transformers.MegatronBertConfig,
                         "MegatronBert", kwargs)


def bert_batches(name, shape):
    """Synthetic BERT micro-batches of `shape` (..., micro_batch), as e2e_gpu's
    BERT_VOCAB comment says: ids, token types, attention mask, MLM labels
    (-100 = none) [..., b, s] and next-sentence labels [..., b]."""
    s, vocab = seq_of(name), BERT_VOCAB[name]
    real = s - torch.randint(0, s // 2 + 1, shape)
    position = torch.arange(s)
    live = position < real[..., None]
    ids = torch.randint(0, vocab, shape + (s,)) * live
    token_types = (live & (position >= (real // 2)[..., None])).long()
    labelled = live & ((position == 1) | (torch.rand(shape + (s,)) < 0.15))
    labels = torch.where(labelled, torch.randint(0, vocab, shape + (s,)), torch.full_like(ids, -100))
    next_sentence = torch.randint(0, 2, shape)
    return [t.cuda() for t in (ids, token_types, live.long(), labels, next_sentence)]


def make_t5(name, dropout):
    """T5ForConditionalGeneration v1.0 (RMS norms, 32 relative buckets over 128, ReLU, the
    head tied to the shared table and scaled by d_model^-0.5, pad = decoder start = 0). T5's
    attention adds a position bias to its scores: SDPA where this transformers has it for T5,
    else its eager attention (the row's "attention" names which ran)."""
    layers, hidden, heads = SHAPES[name]
    decoder_layers, d_kv, d_ff, _, vocab = T5[name]
    kwargs = dict(vocab_size=vocab, d_model=hidden, d_kv=d_kv, d_ff=d_ff, num_layers=layers,
                  num_decoder_layers=decoder_layers, num_heads=heads,
                  relative_attention_num_buckets=32, relative_attention_max_distance=128,
                  dropout_rate=dropout, layer_norm_epsilon=1e-6, feed_forward_proj="relu",
                  tie_word_embeddings=True, pad_token_id=0, decoder_start_token_id=0,
                  eos_token_id=1)
    return sdpa_or_eager(transformers.T5ForConditionalGeneration, transformers.T5Config, "T5",
                         kwargs)


def t5_batches(name, shape):
    """Synthetic T5 micro-batches of `shape` (..., micro_batch), as e2e_gpu's T5
    comment says: encoder ids and attention mask [..., b, s_enc], decoder input ids,
    decoder attention mask and labels (-100 = none) [..., b, s_dec]."""
    s, (_, _, _, sd, vocab) = seq_of(name), T5[name]
    encoder_live = torch.arange(s) < (s - torch.randint(0, s // 2 + 1, shape))[..., None]
    ids = torch.randint(0, vocab, shape + (s,)) * encoder_live
    position = torch.arange(sd)
    decoder_live = position < (2 + torch.randint(0, sd - 1, shape))[..., None]
    decoder_ids = torch.randint(0, vocab, shape + (sd,)) * (decoder_live & (position > 0))
    labels = torch.where(decoder_live, torch.randint(0, vocab, shape + (sd,)),
                         torch.full(shape + (sd,), -100))
    return [t.cuda() for t in (ids, encoder_live.long(), decoder_ids, decoder_live.long(), labels)]


def make_model(name, dropout):
    """GPT2LMHeadModel, or LlamaForCausalLM for the llama shapes (RMSNorm,
    rotary, grouped queries, SwiGLU, no biases, untied head), with SDPA."""
    layers, hidden, heads = SHAPES[name]
    if name in LLAMA:
        groups, ffn = LLAMA[name]
        config = transformers.LlamaConfig(
            num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
            num_key_value_heads=groups, intermediate_size=ffn, max_position_embeddings=seq_of(name),
            vocab_size=50304, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
            attention_dropout=dropout, attn_implementation="sdpa")
        return transformers.LlamaForCausalLM(config)
    config = transformers.GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, n_positions=seq_of(name),
                                     vocab_size=50304, resid_pdrop=dropout, embd_pdrop=dropout,
                                     attn_pdrop=dropout,
                                     attn_implementation="sdpa")
    return transformers.GPT2LMHeadModel(config)


def run(name, micro_batch, steps, warmup, accumulate=1, tune_gemms=False, dropout=0.0):
    """One optimizer step = `accumulate` micro-batches (gradient accumulation).
    `dropout`: GPT2Config's resid_pdrop, embd_pdrop and attn_pdrop (SDPA
    then drops the attention probabilities inside its fused kernel).
    `tune_gemms`: PyTorch's TunableOp times the GEMM solutions of each shape at
    its first call (the warm-up steps) and keeps the fastest, as meshtron's
    run.gemm_autotune does."""
    if tune_gemms:
        torch.cuda.tunable.enable(True)
        torch.cuda.tunable.tuning_enable(True)
        if hasattr(torch.cuda.tunable, "write_file_on_exit"):  # newer PyTorch only
            torch.cuda.tunable.write_file_on_exit(False)
        else:  # older ones write the tuned results on exit: keep them out of the tree
            torch.cuda.tunable.set_filename(f"/tmp/tunableop_results_{os.getpid()}.csv")
    bert, t5 = name in BERT_VOCAB, name in T5
    make = make_bert if bert else make_t5 if t5 else make_model
    model = make(name, dropout).cuda().train()  # dropout when asked for
    seq = seq_of(name)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    step_fn = torch.compile(model)
    if bert:
        batches = bert_batches(name, (steps + warmup, accumulate, micro_batch))
    elif t5:
        batches = t5_batches(name, (steps + warmup, accumulate, micro_batch))
    else:
        tokens = torch.randint(0, 50257, (steps + warmup, accumulate, micro_batch, seq + 1), device="cuda")

    def micro_batch_loss(k, a):
        """The micro-batch's loss (autocast on): the next-token cross-entropy,
        BERT's MLM cross-entropy over the labelled tokens + the binary head's,
        or T5's cross-entropy over the labelled decoder tokens."""
        cross_entropy = torch.nn.functional.cross_entropy
        if t5:
            ids, mask, decoder_ids, decoder_mask, labels = (t[k, a] for t in batches)
            logits = step_fn(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids,
                             decoder_attention_mask=decoder_mask).logits
            return cross_entropy(logits.float().view(-1, logits.size(-1)), labels.reshape(-1),
                                 ignore_index=-100)
        if bert:
            ids, token_types, mask, labels, next_sentence = (t[k, a] for t in batches)
            out = step_fn(input_ids=ids, token_type_ids=token_types, attention_mask=mask)
            logits = out.prediction_logits
            return cross_entropy(logits.float().view(-1, logits.size(-1)), labels.reshape(-1),
                                 ignore_index=-100) + \
                cross_entropy(out.seq_relationship_logits.float(), next_sentence)
        x, y = tokens[k, a, :, :-1], tokens[k, a, :, 1:]
        logits = step_fn(x).logits
        return cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1))

    def train_step(k):
        for a in range(accumulate):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = micro_batch_loss(k, a)
            (loss / accumulate).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for k in range(warmup):
        train_step(k)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for k in range(warmup, warmup + steps):
        loss = train_step(k)
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - t0) / steps
    row = report(name, "pytorch", micro_batch, 1, 1e3 * seconds,
                 {"loss": round(loss.item(), 4),
                  "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
                  "torch": torch.__version__, "device": torch.cuda.get_device_name(),
                  "attention": model.config._attn_implementation},
                 accumulate=accumulate)
    del model, opt, step_fn
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return row


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", nargs="+", default=["124m", "350m", "774m"])
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--accumulate", type=int, default=1, help="micro-batches per step")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    for name in args.models:
        run(name, args.micro_batch, args.steps, args.warmup, accumulate=args.accumulate)
