#!/usr/bin/env python3
"""Synthetic MNIST-format data for the image benchmark cases: an IDX image file of COUNT
random 28 x 28 bytes and its IDX label file (10 classes), in DIR as
train-images-idx3-ubyte and train-labels-idx1-ubyte (fixed seed).

usage: bench/make_synthetic_idx.py DIR [--count N] [--size S]"""
import argparse
import os
import random
import struct


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--count", type=int, default=1024)
    ap.add_argument("--size", type=int, default=28)
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    rng = random.Random(1234)
    with open(os.path.join(a.dir, "train-images-idx3-ubyte"), "wb") as f:
        f.write(struct.pack(">IIII", 0x803, a.count, a.size, a.size))
        f.write(bytes(rng.getrandbits(8) for _ in range(a.count * a.size * a.size)))
    with open(os.path.join(a.dir, "train-labels-idx1-ubyte"), "wb") as f:
        f.write(struct.pack(">II", 0x801, a.count))
        f.write(bytes(rng.randrange(10) for _ in range(a.count)))


if __name__ == "__main__":
    main()
