#!/usr/bin/env python3
"""Golden BERT and T5 samples from Megatron-LM's own code (megatron_samples_golden.json).

Runs the sample-building methods of a Megatron-LM checkout
(MaskedWordPieceDataset._create_masked_lm_predictions and the __getitem__ /
_get_token_mask of BERTMaskedWordPieceDataset and T5MaskedWordPieceDataset)
on a small synthetic vocabulary and sentence set, without torch: the
methods are read from the checkout's source, compiled on their own and
bound to a stand-in object that carries the config, tokenizer ids and
sentences they read. Each case records its sentences, target length and
sample index with Megatron's output, which tests/data compares with
meshtron's make_bert_sample / make_t5_sample.

    /usr/bin/python3 make_megatron_samples_golden.py PATH/TO/Megatron-LM

Needs numpy, and g++ with pybind11's headers for the samples mapping: the
checkout's megatron/core/datasets/helpers.cpp is compiled to run its
build_mapping on a few settings (Debian: python3-numpy, pybind11-dev,
python3-dev; run with /usr/bin/python3).

Vocabulary: 0 [PAD], 1 [CLS], 2 [SEP], 3 [MASK], 4 [BOS], 5 [EOS], 10-499
word pieces, 500-899 "##" continuation pieces, 900-999 T5 sentinels.
"""
import ast
import collections
import json
import os
import sys
import types
import typing

import numpy

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB = 1000
PAD, CLS, SEP, MASK, BOS, EOS = 0, 1, 2, 3, 4, 5
SENTINELS = list(range(900, 1000))


def method_sources(path, class_name, names):
    """Source of the methods `names` of class `class_name` in file `path`."""
    with open(path) as f:
        source = f.read()
    tree = ast.parse(source)
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name in names:
                    item.decorator_list = []
                    found[item.name] = ast.unparse(item)
    missing = set(names) - set(found)
    if missing:
        sys.exit(f"{path}: {class_name} has no {sorted(missing)}")
    return found


def compile_methods(sources):
    namespace = {"numpy": numpy, "deque": collections.deque}
    namespace.update({k: getattr(typing, k) for k in ("List", "Tuple", "Optional", "Dict", "Union")})
    for src in sources.values():
        exec(compile(src, "<megatron>", "exec"), namespace)
    return {name: namespace[name] for name in sources}


def inv_vocab():
    return {i: ("##w%d" % i if 500 <= i < 900 else "w%d" % i) for i in range(VOCAB)}


def tokenizer():
    t = types.SimpleNamespace(cls=CLS, sep=SEP, mask=MASK, pad=PAD, bos=BOS, eos=EOS,
                              inv_vocab=inv_vocab(), additional_special_tokens_ids=SENTINELS)
    return t


def sentences(count, seed):
    """Deterministic sentences of 3-40 ids in [10, 900) (a plain LCG)."""
    state = seed
    def draw(n):
        nonlocal state
        state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
        return (state >> 33) % n
    out = []
    for _ in range(count):
        out.append([10 + draw(890) for _ in range(3 + draw(38))])
    return out


class Stand:
    """What the Megatron methods read from `self`."""

    def __init__(self, methods, config, data, token_lookup):
        self.config = config
        self.dataset = [numpy.array(s, dtype=numpy.int64) for s in data]
        self.sample_index = {}
        self.token_lookup = token_lookup
        self._pad_token_id = PAD
        for name, fn in methods.items():
            setattr(self, name, types.MethodType(fn, self))


def masking_config(**kw):
    base = dict(masking_probability=0.15, short_sequence_probability=0.1,
                masking_do_permutation=False, masking_use_longer_ngrams=False,
                tokenizer=tokenizer(), random_seed=1234)
    base.update(kw)
    return types.SimpleNamespace(**base)


def as_list(a):
    return [int(x) for x in a]


def run_cases(stand, data, rng, count, max_sentences, target_max, make_case):
    cases = []
    while len(cases) < count:
        first = int(rng.randint(0, len(data) - max_sentences))
        pairs = getattr(stand.config, "classification_head", False)
        n = int(rng.randint(2 if pairs else 1, max_sentences + 1))
        target = target_max if rng.random() < 0.7 else int(rng.randint(2, target_max + 1))
        index = int(rng.randint(0, 10**6))
        stand.sample_index[index] = (first, first + n, target)
        try:
            out = stand.__getitem__(index)
        except (AssertionError, IndexError):  # decoder too short / sentinels run out
            continue
        case = {"index": index, "target_length": target,
                "sentences": [data[s] for s in range(first, first + n)]}
        case.update(make_case(out))
        cases.append(case)
    return cases


def bert_golden(root, data, binary_head):
    d = os.path.join(root, "megatron", "core", "datasets")
    methods = compile_methods({
        **method_sources(os.path.join(d, "masked_dataset.py"), "MaskedWordPieceDataset",
                         ["_create_masked_lm_predictions"]),
        **method_sources(os.path.join(d, "bert_dataset.py"), "BERTMaskedWordPieceDataset",
                         ["__getitem__", "_get_token_mask"]),
    })
    # examples/bert/pretrain_bert.py's masking settings.
    config = masking_config(sequence_length=64, masking_max_ngram=3, masking_do_full_word=True,
                            masking_use_geometric_distribution=False,
                            classification_head=binary_head)
    stand = Stand(methods, config, data, sorted(inv_vocab().keys()))
    rng = numpy.random.RandomState(7 if binary_head else 8)
    make = lambda o: {"tokens": as_list(o["text"]), "token_types": as_list(o["types"]),
                      "labels": as_list(o["labels"]), "loss_mask": as_list(o["loss_mask"]),
                      "is_random": int(o["is_random"]), "truncated": int(o["truncated"])}
    cases = run_cases(stand, data, rng, 25, 6, 61, make)
    return {"seq_length": 64, "seed": 1234, "binary_head": binary_head, "cases": cases}


def t5_golden(root, data):
    d = os.path.join(root, "megatron", "core", "datasets")
    methods = compile_methods({
        **method_sources(os.path.join(d, "masked_dataset.py"), "MaskedWordPieceDataset",
                         ["_create_masked_lm_predictions"]),
        **method_sources(os.path.join(d, "t5_dataset.py"), "T5MaskedWordPieceDataset",
                         ["__getitem__", "_get_token_mask"]),
    })
    # examples/t5/pretrain_t5.py's masking settings (geometric p = 0.2 is
    # fixed inside Megatron: meshtron's mean_span_length = 5).
    config = masking_config(sequence_length=96, sequence_length_encoder=96,
                            sequence_length_decoder=40, masking_max_ngram=10,
                            masking_do_full_word=True, masking_use_geometric_distribution=True)
    stand = Stand(methods, config, data, list(inv_vocab().keys()))
    rng = numpy.random.RandomState(9)
    make = lambda o: {"enc_tokens": as_list(o["text_enc"]), "dec_in": as_list(o["text_dec"]),
                      "labels": as_list(o["labels"]), "loss_mask": as_list(o["loss_mask"]),
                      "enc_mask": as_list(o["enc_mask"]), "dec_mask": as_list(o["dec_mask"]),
                      "truncated": int(o["truncated"])}
    cases = run_cases(stand, data, rng, 30, 5, 94, make)
    return {"encoder_seq_length": 96, "decoder_seq_length": 40, "seed": 1234,
            "mean_span_length": 5.0, "cases": cases}


def compile_helpers(root, folder):
    """Megatron's C++ helpers (build_mapping) as a Python module, built with
    g++ and pybind11's headers (Debian: pybind11-dev, python3-dev)."""
    import subprocess
    import sysconfig
    source = os.path.join(root, "megatron", "core", "datasets", "helpers.cpp")
    target = os.path.join(folder, "helpers_cpp" + sysconfig.get_config_var("EXT_SUFFIX"))
    includes = [sysconfig.get_paths()["include"]]
    try:
        import pybind11
        includes.append(pybind11.get_include())
    except ImportError:
        pass
    subprocess.run(["g++", "-O2", "-shared", "-fPIC", "-std=c++17", source, "-o", target]
                   + ["-I" + i for i in includes], check=True)
    sys.path.insert(0, folder)
    import helpers_cpp
    return helpers_cpp


def documents(sentence_lengths, seed):
    """Sentence lengths grouped into documents of 1-8 sentences, plus one
    document holding a sentence longer than 512 tokens (left out by the
    mapping) and one single-sentence document of 600 tokens."""
    rng = numpy.random.RandomState(seed)
    docs, k = [], 0
    while k < len(sentence_lengths):
        n = int(rng.randint(1, 9))
        docs.append(sentence_lengths[k:k + n])
        k += n
    docs.insert(5, [20, 600, 30])
    docs.insert(9, [600])
    return docs


def mapping_golden(root, data):
    import tempfile
    docs = documents([len(s) for s in data], 3)
    bounds = numpy.cumsum([0] + [len(d) for d in docs]).astype(numpy.int64)
    sizes = numpy.array([n for d in docs for n in d], dtype=numpy.int32)
    cases = []
    with tempfile.TemporaryDirectory() as folder:
        helpers = compile_helpers(root, folder)
        # first doc, end doc, num_samples, max_seq_length, short_seq_prob, seed, min sentences
        for first, end, num, length, short, seed, min_sent in [
                (0, len(docs), 300, 61, 0.1, 1234, 2), (3, len(docs) - 2, 50, 94, 0.1, 7, 1),
                (0, len(docs), 900, 509, 0.1, 99, 2), (0, len(docs), 100, 30, 0.0, 5, 2),
                (0, len(docs), 100, 61, 0.5, 1234, 1)]:
            runs = helpers.build_mapping(bounds[first:end + 1], sizes, numpy.iinfo(numpy.int32).max - 1,
                                         num, length, short, seed, False, min_sent)
            cases.append({"first_document": first, "end_document": end, "num_samples": num,
                          "max_tokens": length, "short_seq_prob": short, "seed": seed,
                          "min_sentences": min_sent,
                          "runs": [as_list(r) for r in numpy.asarray(runs)]})
    return {"documents": docs, "cases": cases}


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    root = sys.argv[1]
    data = sentences(400, 11)
    golden = {"bert": bert_golden(root, data, True), "bert_no_binary_head": bert_golden(root, data, False),
              "t5": t5_golden(root, data), "mapping": mapping_golden(root, data)}
    path = os.path.join(HERE, "megatron_samples_golden.json")
    with open(path, "w") as f:
        json.dump(golden, f, separators=(",", ":"))
        f.write("\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
