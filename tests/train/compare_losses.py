#!/usr/bin/env python3
"""compare_losses.py A.jsonl B.jsonl FIRST LAST TOL

Every step line of iterations FIRST..LAST must be in both metrics files, and
their losses and gradient norms must agree to relative TOL."""
import json
import sys


def steps(path):
    out = {}
    with open(path) as f:
        for line in f:
            rec = json.loads(line)  # every line must parse
            if "loss" in rec:
                out[rec["iteration"]] = rec
    return out


a, b = steps(sys.argv[1]), steps(sys.argv[2])
first, last, tol = int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
bad = 0
for it in range(first, last + 1):
    if it not in a or it not in b:
        print(f"iteration {it} missing"); bad += 1; continue
    for key in ("loss", "grad_norm"):
        x, y = a[it][key], b[it][key]
        rel = abs(x - y) / max(abs(y), 1e-30)
        status = "ok" if rel <= tol else "MISMATCH"
        if rel > tol:
            bad += 1
        print(f"iteration {it} {key}: {x:.10g} vs {y:.10g} (rel {rel:.2e}) {status}")
sys.exit(1 if bad else 0)
