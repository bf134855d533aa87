"""Idle analysis of a meshtron GPU trace (logging.profile's trace_rank<R>.json):
merge every kernel, copy and memset interval, then list the idle gaps by size
and by the activities on either side, and the copies and memsets by size.
Usage: python3 perf/trace_gaps.py runs/<name>/trace_rank0.json"""
import json, sys
from collections import defaultdict
from trace_streams import merged, report_gaps
ev = json.load(open(sys.argv[1]))["traceEvents"]
busy, span, gaps = merged(sorted(ev, key=lambda e: e["ts"]))  # every stream as one
print(f"{len(ev)} activities, span {span/1e3:.2f} ms, idle {(span - busy)/1e3:.2f} ms in {len(gaps)} gaps")
report_gaps(gaps, bounds=(0, 5, 20, 100, 1000), min_pair=5, pairs=25, largest=15)
# copies and memsets by (name, bytes)
sizes = defaultdict(lambda: [0, 0.0])
for e in ev:
    b = e.get("args", {}).get("bytes")
    if b is not None:
        k = (e["name"], b); sizes[k][0] += 1; sizes[k][1] += e["dur"]
print("copies/memsets by size (whole trace), top 30 by time:")
for (n, b), (c, t) in sorted(sizes.items(), key=lambda x: -x[1][1])[:30]:
    print(f"  {n:12s} {b:>12d} B  x{c:5d}  {t/1e3:8.3f} ms")
# per stream: busy time, and what follows each small memset on the same stream
streams = defaultdict(list)
for e in ev:
    streams[e["tid"]].append(e)
print("per stream: activities, busy ms (whole trace), top 3 names by time:")
for tid, es in sorted(streams.items(), key=lambda x: -sum(e["dur"] for e in x[1])):
    by = defaultdict(float)
    for e in es: by[e["name"][:60]] += e["dur"]
    top = ", ".join(f"{n} {t/1e3:.2f}" for n, t in sorted(by.items(), key=lambda x: -x[1])[:3])
    print(f"  stream {tid}: {len(es)} activities, {sum(e['dur'] for e in es)/1e3:.2f} ms: {top}")
follow = defaultdict(lambda: [0, 0.0, 0.0])  # next activity after a <= 64-byte memset
for tid, es in streams.items():
    es = sorted(es, key=lambda e: e["ts"])
    for a, b in zip(es, es[1:]):
        if a["name"] == "memset" and a.get("args", {}).get("bytes", 1 << 30) <= 64:
            f = follow[b["name"][:70]]; f[0] += 1; f[1] += a["dur"]; f[2] += b["ts"] - (a["ts"] + a["dur"])
print("small (<= 64 B) memsets by the activity that follows on their stream: count, memset ms, gap ms")
for n, (c, d, g) in sorted(follow.items(), key=lambda x: -x[1][0])[:25]:
    print(f"  {c:5d} {d/1e3:7.3f} {g/1e3:7.3f}  {n}")
