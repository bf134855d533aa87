"""Per-stream time split and compute-stream gaps of a meshtron GPU trace
(logging.profile's trace_rank<R>.json, plain or .gz).

For each stream: activities, span, busy and idle per traced step, time by
kind (gemm, attention, layernorm, copies, ...) and the top kernels. Then
the gaps on the busiest stream (the compute stream): by size, by the
(before, after) pair, and the largest.
Usage: python3 perf/trace_streams.py TRACE STEPS_TRACED"""
import gzip
import json
import sys
from collections import defaultdict

KINDS = (("copy", ("memcpy", "ptop")), ("gemm", ("gemm", "xmma", "cutlass", "nvjet", "sm90_")),
         ("attention", ("flash", "cudnn", "fmha", "attention")), ("layernorm", ("layernorm",)),
         ("nccl", ("nccl",)), ("optimizer", ("adamw", "sum_of_squares", "clip")),
         ("colsums", ("column", "bias_backward")), ("add", ("residual", "add")),
         ("loss", ("cross_entropy", "softmax", "logits")), ("embedding", ("embedding", "sort")))


def kind(name):
    if name == "memset":
        return "memset"
    low = name.lower()
    return next((k for k, keys in KINDS if any(s in low for s in keys)), "other")


def merged(events):
    """(busy us, span us, gaps) of events sorted by start; a gap is
    (length, start offset, name before, name after)."""
    start = events[0]["ts"]
    end, prev, busy, gaps = start, events[0]["name"], 0.0, []
    for e in events:
        s, f = e["ts"], e["ts"] + e["dur"]
        if s > end:
            gaps.append((s - end, end - start, prev[:60], e["name"][:60]))
        if f > end:
            busy += f - max(s, end)
            end, prev = f, e["name"]
    return busy, end - start, gaps


def main():
    path, steps = sys.argv[1], float(sys.argv[2])
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    streams = defaultdict(list)
    for e in events:
        streams[e["tid"]].append(e)
    order = sorted(streams, key=lambda t: -sum(e["dur"] for e in streams[t]))
    for tid in order:
        es = sorted(streams[tid], key=lambda e: e["ts"])
        busy, span, _ = merged(es)
        print(f"stream {tid}: {len(es) / steps:.0f} activities/step, span {span / 1e3 / steps:.2f} "
              f"ms/step, busy {busy / 1e3 / steps:.2f}, idle {(span - busy) / 1e3 / steps:.2f}")
        by, count, names = defaultdict(float), defaultdict(int), defaultdict(lambda: [0.0, 0])
        for e in es:
            by[kind(e["name"])] += e["dur"]
            count[kind(e["name"])] += 1
            names[e["name"][:90]][0] += e["dur"]
            names[e["name"][:90]][1] += 1
        print("   " + ", ".join(f"{k} {v / 1e3 / steps:.2f} ({count[k] / steps:.0f})"
                                for k, v in sorted(by.items(), key=lambda x: -x[1])))
        for n, (t, c) in sorted(names.items(), key=lambda x: -x[1][0])[:12]:
            print(f"      {t / 1e3 / steps:7.2f} ms x{c / steps:5.0f}  {n}")
    compute = sorted(streams[max(streams, key=lambda t: len(streams[t]))], key=lambda e: e["ts"])
    _, span, gaps = merged(compute)
    print(f"compute stream: span {span / 1e3:.2f} ms, idle {sum(g[0] for g in gaps) / 1e3:.2f} ms "
          f"in {len(gaps)} gaps (whole trace)")
    report_gaps(gaps, bounds=(0, 3, 10, 30, 100, 1000), min_pair=3, pairs=20, largest=10)


def report_gaps(gaps, bounds, min_pair, pairs, largest):
    """Print gaps (from merged()) by size class (`bounds` in us), the
    (before, after) pairs of those >= min_pair us, and the largest."""
    for lo, hi in zip(bounds, bounds[1:] + (float("inf"),)):
        sel = [g[0] for g in gaps if lo <= g[0] < hi]
        print(f"  gaps {lo}-{hi} us: {len(sel)} totalling {sum(sel) / 1e3:.2f} ms")
    by_pair = defaultdict(lambda: [0.0, 0])
    for g in gaps:
        if g[0] >= min_pair:
            by_pair[(g[2], g[3])][0] += g[0]
            by_pair[(g[2], g[3])][1] += 1
    print(f"gaps >= {min_pair} us by (before, after), top {pairs}:")
    for (a, b), (t, c) in sorted(by_pair.items(), key=lambda x: -x[1][0])[:pairs]:
        print(f"  {t / 1e3:7.3f} ms x{c:4d}  after {a}  before {b}")
    print(f"largest {largest} gaps:")
    for g in sorted(gaps, reverse=True)[:largest]:
        print(f"  {g[0]:9.1f} us at {g[1] / 1e3:8.2f} ms after {g[2]} before {g[3]}")


if __name__ == "__main__":
    main()
