#!/usr/bin/env python3
"""Golden GPT sample indices for tests/data (gpt_index_golden.json).

Recomputes, with numpy's own RandomState, the three index arrays that
Megatron-LM's GPTDataset builds (doc_idx, sample_idx, shuffle_idx) over the
sequences of golden_uint16.idx, for a few (documents, seq_length,
num_samples, seed) settings. The shuffles here are numpy's, so a C++ build
that matches these arrays shuffles exactly as Megatron-LM does.

    /usr/bin/python3 make_gpt_index_golden.py      # needs numpy only

The arithmetic follows megatron/data/gpt_dataset.py (_num_epochs,
_build_doc_idx, _build_shuffle_idx, the 80% rule for the last epoch) and
its C++ helper build_sample_idx, re-derived here in plain Python.
"""
import json
import os
import struct

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

CASES = [
    # name, first document, end document, seq_length, num_samples, seed
    ("train_two_epochs_separate_last", 0, 44, 64, 100, 1234),
    ("one_epoch", 0, 44, 32, 120, 7),
    ("three_epochs_separate_last", 3, 40, 50, 160, 2024),
    ("three_epochs_joint", 3, 40, 50, 210, 2024),
    ("short_sequences", 10, 30, 8, 700, 99),
    ("short_sequences_joint", 10, 30, 8, 850, 5),
]


def read_sequence_lengths(idx_path):
    with open(idx_path, "rb") as f:
        data = f.read()
    assert data[:9] == b"MMIDIDX\x00\x00"
    count = struct.unpack_from("<Q", data, 18)[0]
    return np.frombuffer(data, dtype=np.int32, count=count, offset=34)


def num_epochs(tokens_per_epoch, seq_length, num_samples):
    epochs, total = 0, 0
    while True:
        epochs += 1
        total += tokens_per_epoch
        if (total - 1) // seq_length >= num_samples:
            return epochs


def shuffled_epochs(documents, epochs, rng):
    doc_idx = np.tile(np.asarray(documents, dtype=np.int32), epochs)
    rng.shuffle(doc_idx)
    return doc_idx


def sample_index(sizes, doc_idx, seq_length, total_tokens):
    num_samples = (total_tokens - 1) // seq_length
    out = [[0, 0]]
    pos, offset = 0, 0
    for _ in range(num_samples):
        remaining = seq_length + 1
        while remaining != 0:
            length = int(sizes[doc_idx[pos]]) - offset
            remaining -= length
            if remaining <= 0:
                offset += remaining + length - 1
                remaining = 0
            else:
                pos += 1
                offset = 0
        out.append([pos, offset])
    return out


def build(sizes, first, end, seq_length, num_samples, seed):
    documents = np.arange(first, end, dtype=np.int32)
    tokens_per_epoch = int(np.sum(sizes[first:end]))
    epochs = num_epochs(tokens_per_epoch, seq_length, num_samples)
    separate = False
    if epochs > 1:
        before_last = ((epochs - 1) * tokens_per_epoch - 1) // seq_length
        per_epoch = (tokens_per_epoch - 1) // seq_length
        separate = (num_samples - before_last) < int(0.80 * per_epoch)
    rng = np.random.RandomState(seed=seed)
    if separate:
        doc_idx = np.concatenate((shuffled_epochs(documents, epochs - 1, rng),
                                  shuffled_epochs(documents, 1, rng)))
    else:
        doc_idx = shuffled_epochs(documents, epochs, rng)
    samples = sample_index(sizes, doc_idx, seq_length, epochs * tokens_per_epoch)
    total = len(samples) - 1
    first_block = before_last if separate else total
    head = np.arange(0, first_block, dtype=np.uint32)
    rng.shuffle(head)
    tail = np.arange(first_block, total, dtype=np.uint32)
    rng.shuffle(tail)
    shuffle_idx = np.concatenate((head, tail))
    return dict(epochs=epochs, separate_last_epoch=bool(separate),
                doc_idx=doc_idx.tolist(), sample_idx=samples,
                shuffle_idx=shuffle_idx.tolist())


def main():
    sizes = read_sequence_lengths(os.path.join(HERE, "golden_uint16.idx"))
    cases = []
    for name, first, end, seq_length, num_samples, seed in CASES:
        case = dict(name=name, first_document=first, end_document=end,
                    seq_length=seq_length, num_samples=num_samples, seed=seed)
        case.update(build(sizes, first, end, seq_length, num_samples, seed))
        cases.append(case)
        print(f"{name}: {case['epochs']} epochs, separate last "
              f"{case['separate_last_epoch']}, {len(case['shuffle_idx'])} samples")
    with open(os.path.join(HERE, "gpt_index_golden.json"), "w") as f:
        json.dump(dict(dataset="golden_uint16", numpy=np.__version__, cases=cases), f)


if __name__ == "__main__":
    main()
