#!/usr/bin/env python3
"""Golden reference for meshtron's BERT in Google's layout: a tiny random
Hugging Face BertForPreTraining in float32 (post-norm blocks, the embedding
LayerNorm, no final norm), one forward and backward on fixed inputs, with
every number meshtron must reproduce written to safetensors.

How to rerun
------------
Needs python3 with torch, transformers, safetensors. Runs on CPU in a few
seconds; no GPU is used. Shares its model sizes, initialisation, inputs and
file writer with make_bert_golden.py (beside it).

    cd validation
    python3 make_bert_postnorm_golden.py --out bert-postnorm-golden

Where torch is not installed, run it on a machine that has the packages,
writing to a scratch folder, and copy the outputs back:

    python3 validation/make_bert_postnorm_golden.py --out /tmp/bert-postnorm-golden
    mkdir -p validation/bert-postnorm-golden
    cp /tmp/bert-postnorm-golden/*.json /tmp/bert-postnorm-golden/*.safetensors \
       validation/bert-postnorm-golden/

Outputs (in --out)
------------------
The files of make_bert_golden.py, for
BertForPreTraining(BertConfig(vocab_size=100, hidden_size=32,
num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
max_position_embeddings=16, type_vocab_size=2, hidden_act gelu,
layer_norm_eps=1e-12, dropout 0, eager attention)), tie_weights() called
explicitly (the MLM decoder is the word table, its bias
cls.predictions.bias), every parameter then redrawn from N(0, 0.1) (norm
weights 1 + N(0, 0.1)):

config.json, model.safetensors   save_pretrained(safe_serialization=True)
golden.safetensors               input_ids, token_type_ids, attention_mask
                                 (sample 1 padded), labels (-100 but at 5
                                 masked positions), next_sentence_label,
                                 prediction_logits, seq_relationship_logits,
                                 loss (masked LM + next sentence) and
                                 grad.<name> for every parameter of
                                 named_parameters().
"""
from transformers import BertConfig, BertForPreTraining

from make_bert_golden import randomised, run, tiny_config_kwargs


def build_model():
    return randomised(BertForPreTraining, BertConfig(**tiny_config_kwargs()))


def main():
    run(build_model, "bert-postnorm-golden", "validation/make_bert_postnorm_golden.py",
        __doc__.splitlines()[0])


if __name__ == "__main__":
    main()
