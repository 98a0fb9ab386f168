"""tunegraph's masked-LM masks (MLM_MASK, kernels/mlm_mask.h) in plain Python.

The masking runs on the device inside the step from a counter-based Philox stream, so
for a given (seed, step, key) it is fixed: make_golden.py draws the same masks here and
feeds them to transformers, and the C golden test checks that the plan's masking op made
exactly these ids and labels.

    Philox4x32-10 key     = (lo32(seed), hi32(seed) ^ hi32(step))
    Philox4x32-10 counter = (lo32(element), hi32(element), lo32(step), stream key)
    u_j = (word_j >> 8) * 2^-24,  j = 0..3
    a position takes part when its mask is not 0 and its id is not special;
    selected = u0 < p (p as a float32); label = id;
    u1 < 0.8f: id = mask_id;  else u2 < 0.5f: id = ((word_3 >> 8) * vocab) >> 24;  else unchanged.
"""

import struct

M32 = 0xFFFFFFFF
PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
IGNORE_INDEX = -100


def float32(x):
    """x rounded to a float32, as a Python float (exact)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def philox4x32_10(ctr, key):
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for _ in range(10):
        p0 = PHILOX_M0 * c0
        p1 = PHILOX_M1 * c2
        n0 = ((p1 >> 32) ^ c1 ^ k0) & M32
        n2 = ((p0 >> 32) ^ c3 ^ k1) & M32
        c1, c3, c0, c2 = p1 & M32, p0 & M32, n0, n2
        k0, k1 = (k0 + PHILOX_W0) & M32, (k1 + PHILOX_W1) & M32
    return c0, c1, c2, c3


def bits24(seed, step, key, block):
    """The four 24-bit draws of Philox block `block` of stream (seed, step, key)."""
    k = (seed & M32, ((seed >> 32) ^ (step >> 32)) & M32)
    c = (block & M32, (block >> 32) & M32, step & M32, key & M32)
    return [w >> 8 for w in philox4x32_10(c, k)]


def mlm_mask(ids, mask, seed, step, key, p, vocab, mask_id, special_ids):
    """ids, mask: flat lists (row-major [B,T]); returns (masked ids, labels) as lists."""
    p32, p08, p05 = float32(p), float32(0.8), float32(0.5)
    special = set(special_ids) | {mask_id}
    out, labels = list(ids), [IGNORE_INDEX] * len(ids)
    for e, (i, m) in enumerate(zip(ids, mask)):
        if m == 0 or i in special:
            continue
        b = bits24(seed, step, key, e)
        u = [x * 2.0 ** -24 for x in b]
        if not u[0] < p32:
            continue
        labels[e] = i
        if u[1] < p08:
            out[e] = mask_id
        elif u[2] < p05:
            out[e] = (b[3] * vocab) >> 24
    return out, labels


if __name__ == "__main__":
    # Random123's known-answer vector for Philox4x32-10 (ctr = key = 0).
    assert philox4x32_10((0, 0, 0, 0), (0, 0)) == (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)
    print("OK")
