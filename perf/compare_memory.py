#!/usr/bin/env python3
"""Compare `bench_cuda_ops memory` tables: each row's fraction of the copy
bandwidth in a baseline and in one or more other runs, the rows that moved,
and how many rows reach the target (issue 9: 0.8 of the copy).

    python3 perf/compare_memory.py BASE.txt NEW.txt [NEW2.txt ...] [--target 0.8] [--moved 0.04]

A file may hold several tables (one per `memory-bound op ...` header, e.g.
two runs appended to one log); every table of the NEW files counts as one
run, and a row's "after" is the lowest and highest of its runs. A row
reaches the target when its lowest run does.
"""
import argparse
import re
import sys

ROW = re.compile(r"^(?P<op>\S.*?)\s+(?P<dtype>bf16|fp16|fp32)\s+(?P<shape>\[[^\]]*\])\s+(?P<rest>\S.*)$")


def tables(path):
    """The tables of one file: a list of {row name: fraction of the copy}."""
    found = []
    with open(path) as f:
        for line in f:
            if line.startswith("memory-bound op"):
                found.append({})
                continue
            match = ROW.match(line.rstrip("\n"))
            if not match or not found:
                continue
            fields = match.group("rest").split()
            if len(fields) < 3:
                continue
            name = f"{match.group('op')} {match.group('dtype')} {match.group('shape')}"
            found[-1][name] = float(fields[2])  # ms, GB/s, /copy, ...
    return [t for t in found if t]


def compare(base, runs, target=0.8, moved=0.04):
    """Rows as (name, base fraction, lowest run, highest run, moved?), and the
    counts of rows at the target before and after."""
    rows = []
    for name, before in base.items():
        values = [run[name] for run in runs if name in run]
        if not values:
            continue
        low, high = min(values), max(values)
        rows.append((name, before, low, high, abs(low - before) >= moved or abs(high - before) >= moved))
    reached_before = sum(1 for r in rows if r[1] >= target)
    reached_after = sum(1 for r in rows if r[2] >= target)
    return rows, reached_before, reached_after


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base")
    parser.add_argument("new", nargs="+")
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--moved", type=float, default=0.04,
                        help="list a row as moved when a run differs by this much (default 0.04)")
    args = parser.parse_args(argv)
    base_tables = tables(args.base)
    if not base_tables:
        sys.exit(f"compare_memory: no `bench_cuda_ops memory` table in {args.base}")
    runs = [t for path in args.new for t in tables(path)]
    if not runs:
        sys.exit("compare_memory: no `bench_cuda_ops memory` table in " + " ".join(args.new))
    rows, before, after = compare(base_tables[0], runs, args.target, args.moved)
    print(f"{len(rows)} rows, {len(runs)} run(s) against {args.base}: "
          f"{before} -> {after} at {args.target:.2f} of the copy or more")
    print("moved:")
    for name, base, low, high, moved in rows:
        if moved:
            print(f"  {name:58s} {base:5.2f} -> {low:.2f}-{high:.2f}")
    print(f"below {args.target:.2f}:")
    for name, base, low, high, _ in rows:
        if low < args.target:
            print(f"  {name:58s} {low:.2f}-{high:.2f} (base {base:.2f})")


if __name__ == "__main__":
    main()
