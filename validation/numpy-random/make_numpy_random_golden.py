#!/usr/bin/env python3
"""Golden draws of numpy's legacy RandomState for tests/data (numpy_random_golden.json).

The BERT and T5 sample builders follow Megatron-LM's numpy code draw for
draw; src/data/numpy_random.* re-implements the draws they make. This
script records numpy's own values for several seeds, so the C++ draws can
be compared one by one:

    /usr/bin/python3 validation/numpy-random/make_numpy_random_golden.py   # needs numpy only
"""
import json
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SEEDS = [0, 1, 1234, 2**31 + 7, 2**32 - 1]


def draws(seed):
    """Each kind of draw from a fresh RandomState(seed)."""
    out = {"seed": seed}
    r = np.random.RandomState(seed)
    out["uniform"] = [float(r.random()) for _ in range(20)]
    r = np.random.RandomState(seed)
    out["randint_0_30522"] = [int(r.randint(0, 30522)) for _ in range(20)]
    r = np.random.RandomState(seed)
    out["randint_1_7"] = [int(r.randint(1, 7)) for _ in range(20)]
    for name, p in (("geometric_0.2", 0.2), ("geometric_1/3", 1.0 / 3.0), ("geometric_0.5", 0.5)):
        r = np.random.RandomState(seed)
        out[name] = [int(r.geometric(p)) for _ in range(20)]
    # Megatron's N-gram choice: P(N) ~ 1/N for N = 1..3, normalised twice.
    nvals = np.arange(3, dtype=np.int64) + 1
    probs = 1.0 / nvals
    probs = probs / probs.sum(keepdims=True)
    probs = probs / probs.sum(keepdims=True)
    r = np.random.RandomState(seed)
    out["choice_inverse_n3"] = [int(r.choice(nvals, p=probs)) - 1 for _ in range(20)]
    r = np.random.RandomState(seed)
    items = list(range(25))
    r.shuffle(items)
    out["shuffle_25"] = items
    return out


def main():
    golden = {"cases": [draws(s) for s in SEEDS]}
    path = os.path.join(HERE, "numpy_random_golden.json")
    with open(path, "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
