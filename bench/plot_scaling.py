#!/usr/bin/env python3
"""Summarises bench/run_scaling.sh's files in OUT: OUT/scaling.json (step medians, speedups
over one GPU, exposed communication) and OUT/scaling.svg (speedup against GPU count, one
line per case and framework, with the ideal). Plain SVG: no plotting package needed.

usage: python3 bench/plot_scaling.py OUT
"""
import glob
import json
import os
import statistics
import sys

CASES = ["bert-base-cls-b32-t128", "gpt2-lm-b16-t1024"]


def tunegraph_runs(out, case, zero1=False):
    """Plain data parallelism, or ZeRO-1 (files ending -zero1.jsonl)."""
    runs = {}
    for path in glob.glob(os.path.join(out, f"scaling-tunegraph-{case}-*.jsonl")):
        if path.endswith("-zero1.jsonl") != zero1:
            continue
        rows = [json.loads(l) for l in open(path) if l.strip()]
        steps = [r for r in rows if "step_ms" in r and "summary" not in r][10:]
        summary = [r for r in rows if r.get("summary")]
        if not steps or not summary:
            continue
        n = summary[-1].get("replicas", 1)
        runs[n] = dict(step_ms=summary[-1]["median_step_ms"],
                       optimizer_ms=statistics.median(r["optimizer_ms"] for r in steps),
                       backward_ms=statistics.median(r["backward_ms"] for r in steps))
        # The gradient sums the steps stamped (data parallelism on CUDA): busy and exposed ms.
        if "median_comm_ms" in summary[-1]:
            runs[n]["comm_ms"] = summary[-1]["median_comm_ms"]
            runs[n]["exposed_comm_ms"] = summary[-1]["median_exposed_comm_ms"]
    return runs


def ddp_runs(out, case):
    """The fastest DDP mode at each GPU count."""
    best = {}
    for path in glob.glob(os.path.join(out, f"scaling-ddp-{case}-*.json")):
        doc = json.load(open(path))
        for r in doc["results"]:
            if "pipelined_step_ms" in r and (r["world"] not in best or r["pipelined_step_ms"] < best[r["world"]]["step_ms"]):
                best[r["world"]] = dict(step_ms=r["pipelined_step_ms"], mode=doc.get("mode"))
    return best


def speedups(runs, base=None):
    """Throughput over one GPU: n * (one GPU's step) / (n GPUs' step); base: the one-GPU runs
    to compare with (ZeRO-1 has no one-GPU run of its own)."""
    base = base or runs
    if 1 not in base:
        return {}
    return {n: n * base[1]["step_ms"] / r["step_ms"] for n, r in sorted(runs.items())}


def svg(series, path):
    w, h, pad = 520, 380, 50
    xs = [1, 2, 4, 8]
    x = lambda n: pad + (w - 2 * pad) * (xs.index(n) if n in xs else 0) / (len(xs) - 1)
    y = lambda s: h - pad - (h - 2 * pad) * s / 8.0
    colors = ["#1f77b4", "#9467bd", "#d62728", "#2ca02c", "#17becf", "#ff7f0e"]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
             f'<rect width="{w}" height="{h}" fill="white"/>',
             f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="black"/>',
             f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="black"/>',
             f'<polyline fill="none" stroke="#999" stroke-dasharray="4 3" points="'
             + " ".join(f"{x(n)},{y(n)}" for n in xs) + '"/>',
             f'<text x="{w / 2}" y="{h - 12}" text-anchor="middle">GPUs</text>',
             f'<text x="14" y="{h / 2}" transform="rotate(-90 14 {h / 2})" text-anchor="middle">speedup over one GPU</text>']
    for n in xs:
        parts.append(f'<text x="{x(n)}" y="{h - pad + 16}" text-anchor="middle">{n}</text>')
    for s in range(0, 9, 2):
        parts.append(f'<text x="{pad - 8}" y="{y(s) + 4}" text-anchor="end">{s}</text>')
    for k, (name, sp) in enumerate(series):
        if not sp:
            continue
        c = colors[k % len(colors)]
        pts = " ".join(f"{x(n)},{y(v)}" for n, v in sorted(sp.items()) if n in xs)
        parts.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="{pts}"/>')
        parts.append(f'<text x="{pad + 10}" y="{pad + 14 * k}" fill="{c}">{name}</text>')
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts))


def main():
    out = sys.argv[1]
    doc, series = {}, []
    for case in CASES:
        tg, ddp, zero = tunegraph_runs(out, case), ddp_runs(out, case), tunegraph_runs(out, case, zero1=True)
        entry = dict(tunegraph=tg, ddp=ddp, tunegraph_zero1=zero, tunegraph_speedup=speedups(tg),
                     tunegraph_zero1_speedup=speedups(zero, tg), ddp_speedup=speedups(ddp))
        # Exposed communication: the optimizer phase's growth over one GPU, as a share of the step.
        if 1 in tg:
            entry["exposed_comm_share"] = {n: (r["optimizer_ms"] - tg[1]["optimizer_ms"]) / r["step_ms"]
                                           for n, r in tg.items()}
        doc[case] = entry
        series += [(f"tunegraph {case}", entry["tunegraph_speedup"]),
                   (f"tunegraph ZeRO-1 {case}", entry["tunegraph_zero1_speedup"]), (f"DDP {case}", entry["ddp_speedup"])]
    with open(os.path.join(out, "scaling.json"), "w") as f:
        json.dump(doc, f, indent=1)
    svg(series, os.path.join(out, "scaling.svg"))
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
