#!/usr/bin/env python3
"""Writes scikit-learn's handwritten digits (digits.csv.gz: 1,797 rows of 64 pixels, 0 to
16, then the label) as the two kinds of input `tunegraph data convert` reads for images:

  OUT/train-images-idx3-ubyte.gz, OUT/train-labels-idx1-ubyte.gz
      the training images (4 of every 5 rows: 1,437) as MNIST distributes its files,
      gzip'd IDX (--format idx)
  OUT/test/LABEL/NNNN.png
      the test images (every 5th row: 360) as 8-bit gray PNG files in a folder per label
      (--format images)

Pixels are scaled from 0-16 to 0-255 (round(v x 255 / 16)). Prints the training pixels'
mean and standard deviation (on 0-1), the job's image_mean and image_std. Python's
standard library alone; the output is the same byte for byte on every run.

usage: make_digits.py DIGITS_CSV_GZ OUT
"""
import gzip
import math
import os
import struct
import sys
import zlib


def png_gray(width, height, pixels):
    """An 8-bit gray PNG: IHDR, one IDAT (each row with filter type 0), IEND."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\0" + bytes(pixels[y * width:(y + 1) * width]) for y in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b""))


def write_gzip(path, data):
    # mtime 0 and no file name in the header: the same bytes every run.
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
        f.write(data)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-1])
    src, out = sys.argv[1], sys.argv[2]
    rows = []
    for line in gzip.open(src, "rt"):
        values = [int(float(v)) for v in line.split(",")]
        if len(values) != 65 or not all(0 <= v <= 16 for v in values[:64]) or not 0 <= values[64] <= 9:
            sys.exit(f"{src}: a row of {len(values)} values is not 64 pixels of 0-16 and a label")
        rows.append(([round(v * 255 / 16) for v in values[:64]], values[64]))
    train = [r for i, r in enumerate(rows) if i % 5 != 0]
    test = [(i, r) for i, r in enumerate(rows) if i % 5 == 0]
    os.makedirs(out, exist_ok=True)
    images = struct.pack(">BBBBIII", 0, 0, 8, 3, len(train), 8, 8) + b"".join(bytes(p) for p, _ in train)
    labels = struct.pack(">BBBBI", 0, 0, 8, 1, len(train)) + bytes(label for _, label in train)
    write_gzip(os.path.join(out, "train-images-idx3-ubyte.gz"), images)
    write_gzip(os.path.join(out, "train-labels-idx1-ubyte.gz"), labels)
    for i, (pixels, label) in test:
        folder = os.path.join(out, "test", str(label))
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{i:04d}.png"), "wb") as f:
            f.write(png_gray(8, 8, pixels))
    values = [v / 255 for p, _ in train for v in p]
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    print(f"{len(train)} training images (gzip'd IDX), {len(test)} test images (PNG); "
          f"training pixels: mean {mean:.4f}, std {std:.4f}")


if __name__ == "__main__":
    main()
