#!/usr/bin/env python3
"""Writes pre-tokenized JSON Lines of random full-length sequences for benchmarks.

usage: make_synthetic_data.py OUT.jsonl --vocab V --seq T --count N [--labels L] [--seed S]
Every sequence has exactly T tokens (no padding), like the PyTorch baseline's inputs.
"""
import argparse
import json
import random


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--labels", type=int, default=0, help="classes for a 'label' field; 0 for lm")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    with open(a.out, "w") as f:
        for _ in range(a.count):
            row = {"input_ids": [rng.randrange(1, a.vocab) for _ in range(a.seq)]}
            if a.labels:
                row["label"] = rng.randrange(a.labels)
            f.write(json.dumps(row, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
