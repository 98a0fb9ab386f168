#!/usr/bin/env python3
"""Checks that a LoRA run changed its adapters and nothing else (the standard library alone).

    examples/bbc-news/check_lora.py BASE LORA INIT.safetensors FINAL.safetensors

BASE is the Hugging Face folder the LoRA job loaded (its model.safetensors), LORA the folder
the LoRA run exported (`run --save-dir`: model.safetensors with the adapters merged in, and
adapter/ with adapter_config.json and adapter_model.safetensors as PEFT saves them), INIT
the weights a run of the same plan saved after one step at learning rate 0 (`run --set
steps=1 --save`: the adapters as initialised) and FINAL the weights the LoRA run saved after
training (`run --save`). Each safetensors file is read whole, its header checked against
its size.

Checks, each printed with its numbers:
  1. every tensor of BASE is in INIT and in FINAL, byte for byte (same dtype, shape, bytes);
     INIT and FINAL hold nothing else but lora_A / lora_B pairs, one for each targeted
     projection weight;
  2. every lora_B is all zeros in INIT and not in FINAL, and every lora_A moved;
  3. adapter/adapter_model.safetensors holds FINAL's adapters, byte for byte, under PEFT's names
     (base_model.model. + the name), and adapter_config.json's r and target_modules agree;
  4. LORA's model.safetensors has BASE's tensors, the untargeted ones byte for byte and each
     targeted W as W + (lora_alpha / r) B A, computed here in double and rounded to float32
     (within 1e-6 of the largest |W + (alpha / r) B A| of that tensor: the products' sums may
     round the other way), and different from W.
Exits 0 and prints PASS when all hold; prints FAIL with each failure and exits 1 otherwise.
"""
import array
import json
import os
import struct
import sys

DTYPE_SIZE = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def read_safetensors(path):
    """{name: (dtype, shape, bytes)} of a safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        sys.exit(f"{path}: too short for a safetensors file")
    n = struct.unpack("<Q", data[:8])[0]
    if 8 + n > len(data):
        sys.exit(f"{path}: header length {n} past the file's {len(data)} bytes")
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        begin, end = t["data_offsets"]
        count = 1
        for d in t["shape"]:
            count *= d
        if end > len(body) or end - begin != count * DTYPE_SIZE.get(t["dtype"], 0):
            sys.exit(f"{path}: tensor {name}: offsets {begin}..{end} do not fit {t['dtype']} {t['shape']}")
        out[name] = (t["dtype"], tuple(t["shape"]), body[begin:end])
    return out


def floats(t, what):
    dtype, _, raw = t
    if dtype != "F32":
        sys.exit(f"{what}: dtype {dtype}; this checker reads F32 adapters and weights (an fp32 run)")
    a = array.array("f")
    a.frombytes(raw)
    if sys.byteorder != "little":
        a.byteswap()
    return a


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__.split("\n\n")[1])
    base_dir, lora_dir, init_path, final_path = sys.argv[1:]
    base = read_safetensors(os.path.join(base_dir, "model.safetensors"))
    init = read_safetensors(init_path)
    final = read_safetensors(final_path)
    merged = read_safetensors(os.path.join(lora_dir, "model.safetensors"))
    adapter = read_safetensors(os.path.join(lora_dir, "adapter", "adapter_model.safetensors"))
    with open(os.path.join(lora_dir, "adapter", "adapter_config.json")) as f:
        config = json.load(f)
    failures = []

    def fail(msg):
        failures.append(msg)
        print("  FAIL: " + msg)

    # 1. The base, byte for byte, in the initial and final weights; nothing else but adapters.
    values = sum(len(t[2]) // DTYPE_SIZE[t[0]] for t in base.values())
    for label, weights in (("initial", init), ("final", final)):
        same = 0
        for name, t in base.items():
            if name not in weights:
                fail(f"{label} weights: no {name}")
            elif weights[name] != t:
                fail(f"{label} weights: {name} differs from the base folder's")
            else:
                same += 1
        extra = [n for n in weights if n not in base and not n.endswith((".lora_A.weight", ".lora_B.weight"))]
        for n in extra:
            fail(f"{label} weights: {n} is neither a base tensor nor an adapter")
        print(f"base weights in the {label} LoRA weights: {same} of {len(base)} tensors ({values:,} values) "
              f"bit-identical to {base_dir}/model.safetensors")

    # 2. The adapters: B zero at the start and not after, A moved.
    pairs = sorted(n[: -len(".lora_A.weight")] for n in final if n.endswith(".lora_A.weight"))
    if not pairs:
        fail(f"{final_path}: no lora_A tensors")
    b_max = a_moved = 0.0
    b_nonzero = a_changed = 0
    for stem in pairs:
        a_name, b_name, w_name = stem + ".lora_A.weight", stem + ".lora_B.weight", stem + ".weight"
        missing = [f"{label} weights: no {name}" for name in (a_name, b_name)
                   for label, weights in (("initial", init), ("final", final)) if name not in weights]
        if w_name not in base:
            missing.append(f"{a_name}: no base weight {w_name}")
        for msg in missing:
            fail(msg)
        if missing:
            continue
        b0, b1 = floats(init[b_name], b_name), floats(final[b_name], b_name)
        if any(v != 0.0 for v in b0):
            fail(f"initial weights: {b_name} is not all zeros")
        top = max(abs(v) for v in b1)
        if top == 0.0:
            fail(f"final weights: {b_name} is still all zeros")
        else:
            b_nonzero += 1
        b_max = max(b_max, top)
        a0, a1 = floats(init[a_name], a_name), floats(final[a_name], a_name)
        moved = max(abs(x - y) for x, y in zip(a0, a1))
        if moved == 0.0:
            fail(f"final weights: {a_name} did not move")
        else:
            a_changed += 1
        a_moved = max(a_moved, moved)
    trainable = sum(len(final[s + suffix][2]) // 4 for s in pairs for suffix in (".lora_A.weight", ".lora_B.weight"))
    print(f"adapters: {len(pairs)} lora_A/lora_B pairs ({trainable:,} values); lora_B all zeros at the start, "
          f"non-zero after training in {b_nonzero} of {len(pairs)} (largest |B| {b_max:.4g}); "
          f"lora_A moved in {a_changed} of {len(pairs)} (largest change {a_moved:.4g})")

    # 3. The PEFT adapter files.
    expect = {"base_model.model." + n: final[n] for s in pairs for n in (s + ".lora_A.weight", s + ".lora_B.weight")}
    for n, t in expect.items():
        if adapter.get(n) != t:
            fail(f"adapter/adapter_model.safetensors: {n} missing or not byte-equal to the final weights'")
    for n in adapter:
        if n not in expect:
            fail(f"adapter/adapter_model.safetensors: unexpected tensor {n}")
    modules = sorted({s.rsplit(".", 1)[-1] for s in pairs})
    r = final[pairs[0] + ".lora_A.weight"][1][0] if pairs else 0
    if config.get("r") != r or sorted(config.get("target_modules") or []) != modules:
        fail(f"adapter/adapter_config.json: r {config.get('r')} and target_modules {config.get('target_modules')}, "
             f"the weights have r {r} and {modules}")
    print(f"adapter/adapter_model.safetensors: {len(adapter)} tensors, equal to the final adapters under PEFT's names; "
          f"adapter_config.json: r {config.get('r')}, lora_alpha {config.get('lora_alpha')}, target_modules {modules}")

    # 4. The merged model.
    scale = float(config.get("lora_alpha", 0)) / r if r else 0.0
    targeted = {s + ".weight": s for s in pairs}
    untouched = merged_ok = 0
    worst = 0.0
    changed = 0
    for name, t in base.items():
        if name not in merged:
            fail(f"{lora_dir}/model.safetensors: no {name}")
            continue
        if name not in targeted:
            if merged[name] != t:
                fail(f"{lora_dir}/model.safetensors: untargeted {name} differs from the base")
            else:
                untouched += 1
            continue
        stem = targeted[name]
        if stem + ".lora_B.weight" not in final:
            continue  # reported above
        w = floats(t, name)
        a = floats(final[stem + ".lora_A.weight"], stem)
        b = floats(final[stem + ".lora_B.weight"], stem)
        m = floats(merged[name], name)
        rows, cols = t[1]
        rank = len(a) // cols
        want = array.array("f", [0.0]) * (rows * cols)
        for i in range(rows):
            bi = b[i * rank:(i + 1) * rank]
            for j in range(cols):
                s = 0.0
                for k in range(rank):
                    s += bi[k] * a[k * cols + j]
                want[i * cols + j] = w[i * cols + j] + scale * s
        top = max(abs(v) for v in want) or 1.0
        diff = max(abs(x - y) for x, y in zip(want, m)) / top
        worst = max(worst, diff)
        if diff > 1e-6:
            fail(f"{lora_dir}/model.safetensors: {name} is not W + {scale:g} B A (relative difference {diff:.3g})")
        else:
            merged_ok += 1
        if m.tobytes() == w.tobytes():
            fail(f"{lora_dir}/model.safetensors: {name} equals the base weight (the adapter merged nothing)")
        else:
            changed += 1
    print(f"merged {lora_dir}/model.safetensors: {untouched} untargeted tensors bit-identical to the base; "
          f"{merged_ok} of {len(targeted)} targeted weights equal W + {scale:g} B A (largest difference "
          f"{worst:.3g} of the tensor's largest value), {changed} of them different from the base")

    if failures:
        print(f"FAIL: {len(failures)} checks failed")
        return 1
    print("PASS: the LoRA run changed the adapters alone")
    return 0


if __name__ == "__main__":
    sys.exit(main())
