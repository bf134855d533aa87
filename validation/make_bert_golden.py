#!/usr/bin/env python3
"""Golden reference for meshtron's BERT: a tiny random Hugging Face
MegatronBertForPreTraining in float32, one forward and backward on fixed
inputs, with every number meshtron must reproduce written to safetensors.

How to rerun
------------
Needs python3 with torch, transformers, safetensors. Runs on CPU in a few
seconds; no GPU is used.

    cd validation
    python3 make_bert_golden.py --out bert-golden

Where torch is not installed, run it on a machine that has the packages,
writing to a scratch folder, and copy the outputs back:

    python3 make_bert_golden.py --out /tmp/bert-golden
    mkdir -p validation/bert-golden
    cp /tmp/bert-golden/*.json /tmp/bert-golden/*.safetensors validation/bert-golden/

Outputs (in --out)
------------------
config.json, model.safetensors
    MegatronBertForPreTraining.save_pretrained(safe_serialization=True) of
    the model: MegatronBertConfig(vocab_size=100, hidden_size=32,
    num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
    max_position_embeddings=16, type_vocab_size=2, hidden_act gelu,
    layer_norm_eps=1e-12, dropout 0, eager attention). After transformers'
    initialisation every parameter is redrawn from N(0, 0.1) (norm weights
    1 + N(0, 0.1)), so that no bias is zero and a wrong mapping shows.
    The MLM decoder is tied to the word table (and its bias is
    cls.predictions.bias).

golden.safetensors (float32 unless noted; metadata names the versions)
    input_ids             int32 [2, 8]  torch.randint(5, 100), seed 1234;
                          sample 1's last 3 tokens are padding (id 0).
    token_type_ids        int32 [2, 8]  two segments in each sample.
    attention_mask        int32 [2, 8]  1 real, 0 padding.
    labels                int32 [2, 8]  the original id at 5 masked
                          positions (none in padding), -100 elsewhere.
    next_sentence_label   int32 [2]     [1, 0].
    prediction_logits     [2, 8, 100]
    seq_relationship_logits [2, 2]
    loss                  [1]  masked-LM cross-entropy (mean over labelled
                          tokens) + next-sentence cross-entropy (mean).
    grad.<name>           the gradient of loss for every parameter of
                          named_parameters() (the tied decoder appears once,
                          as bert.embeddings.word_embeddings.weight).
"""
import argparse
import os

import safetensors
import torch
import transformers
from safetensors.torch import save_file
from transformers import MegatronBertConfig, MegatronBertForPreTraining

SEED = 1234
BATCH, SEQ, VOCAB = 2, 8, 100
PADDING = 3  # padding tokens at the end of sample 1


def tiny_config_kwargs():
    """The sizes both BERT goldens share (MegatronBertConfig and BertConfig
    take the same fields)."""
    return dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                num_attention_heads=4, intermediate_size=64,
                max_position_embeddings=16, type_vocab_size=2,
                hidden_act="gelu", layer_norm_eps=1e-12,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                initializer_range=0.02, attn_implementation="eager")


def randomised(model_class, config):
    """model_class(config) in fp32 with the MLM decoder tied to the word
    table and its bias, every parameter then redrawn from N(0, 0.1) (norm
    weights 1 + N(0, 0.1)) so that no bias is zero and a wrong mapping
    shows."""
    torch.manual_seed(SEED)
    model = model_class(config).float()
    model.config._attn_implementation = "eager"
    model.tie_weights()  # explicit: whether construction ties depends on the version
    decoder = model.cls.predictions.decoder
    assert decoder.weight is model.get_input_embeddings().weight, "decoder weight not tied"
    if getattr(decoder, "bias", None) is not model.cls.predictions.bias:
        decoder.bias = model.cls.predictions.bias
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape) * 0.1
            is_norm_weight = p.ndim == 1 and ("ln." in name or "LayerNorm" in name) \
                and name.endswith("weight")
            p.copy_(1.0 + noise if is_norm_weight else noise)
    model.train()  # dropout is 0: train mode is deterministic
    return model


def build_model():
    return randomised(MegatronBertForPreTraining, MegatronBertConfig(**tiny_config_kwargs()))


def inputs():
    generator = torch.Generator().manual_seed(SEED)
    input_ids = torch.randint(5, VOCAB, (BATCH, SEQ), generator=generator)
    attention_mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    attention_mask[1, SEQ - PADDING:] = 0
    input_ids[1, SEQ - PADDING:] = 0
    token_type_ids = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1],
                                   [0, 0, 0, 1, 1, 0, 0, 0]])
    labels = torch.full((BATCH, SEQ), -100, dtype=torch.long)
    for b, s in [(0, 1), (0, 4), (0, 7), (1, 2), (1, 4)]:
        labels[b, s] = input_ids[b, s]
    next_sentence_label = torch.tensor([1, 0])
    return dict(input_ids=input_ids, attention_mask=attention_mask,
                token_type_ids=token_type_ids, labels=labels,
                next_sentence_label=next_sentence_label)


def write_golden(model, out, generator):
    """save_pretrained of `model` and golden.safetensors (inputs, logits, loss,
    every gradient) of one forward and backward on inputs() into `out`."""
    os.makedirs(out, exist_ok=True)
    versions = (f"torch {torch.__version__} transformers {transformers.__version__} "
                f"safetensors {safetensors.__version__}")
    print(versions)
    model.save_pretrained(out, safe_serialization=True)
    batch = inputs()
    result = model(**batch, return_dict=True)
    result.loss.backward()

    golden = {k: v.to(torch.int32).contiguous() for k, v in batch.items()}
    golden["prediction_logits"] = result.prediction_logits.detach().contiguous()
    golden["seq_relationship_logits"] = result.seq_relationship_logits.detach().contiguous()
    golden["loss"] = result.loss.detach().reshape(1).contiguous()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        golden["grad." + name] = p.grad.detach().contiguous()
    save_file(golden, os.path.join(out, "golden.safetensors"),
              metadata={"generator": generator, "versions": versions, "seed": str(SEED)})
    print("loss", result.loss.item())
    print("gradients:", [n for n, _ in model.named_parameters()])
    for name in sorted(os.listdir(out)):
        print(f"{out}/{name}: {os.path.getsize(os.path.join(out, name))} bytes")


def run(build, default_out, generator, description):
    """The command line of a BERT golden script: --out, deterministic torch."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", default=default_out, help="output folder (created if missing)")
    args = parser.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    write_golden(build(), args.out, generator)


def main():
    run(build_model, "bert-golden", "validation/make_bert_golden.py",
        __doc__.splitlines()[0])


if __name__ == "__main__":
    main()
