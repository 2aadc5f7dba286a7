#!/usr/bin/env python3
"""summary.md of an A/B (the decode one's by default; or the folder named
as the argument, e.g. docs/bench-null/arc-ab): the own runs' CPU per verdict
read from each round's bench.md."""
import re
import statistics as st
import sys

folder = sys.argv[1] if len(sys.argv) > 1 else "docs/bench-null/decode-ab"

out = {}
for b in ["old", "new"]:
    cpu, vps, rm = [], [], []
    for r in range(1, 11):
        t = open(f"{folder}/{b}-{r}/bench.md").read()
        sec = t.split("**`modstream run` at its default configuration**")[1]
        rows = re.findall(r"^\| (\d) \| (\d+) \| ([\d.]+) \|", sec, re.M)[:3]
        c = [float(x[2]) for x in rows]
        cpu += c
        vps += [int(x[1]) for x in rows]
        rm.append(st.median(c))
    out[b] = (cpu, vps, rm)
print("CPU µs per verdict of `modstream run`, three own runs a round, read from each round's bench.md (rounds 1, 3, 5, 7, 9: old first)")
for b in ["old", "new"]:
    cpu, vps, rm = out[b]
    print(f"{b}: {len(cpu)} runs, median {round(st.median(cpu), 2)}, mean {round(st.mean(cpu), 2)}, round medians {rm}, median verdicts/s {st.median(vps)}")
pairs = list(zip(out["old"][2], out["new"][2]))
lo = sum(n < o for o, n in pairs)
eq = sum(n == o for o, n in pairs)
print(f"new's round median lower in {lo} rounds, equal in {eq}, higher in {10 - lo - eq}")
