#!/usr/bin/env python3
"""PyTorch + torchvision baseline for tunegraph's image benchmark: MobileNetV2 training steps.

One "step" = forward + cross-entropy + backward + clip_grad_norm_(1.0) + AdamW (fused,
weight decay 0.01) + LR scheduler + zero_grad(set_to_none=True), model.train() (batch
statistics, running statistics updated, classifier dropout 0.2), as tunegraph's step.

The study's sizes: batch 64 of 1-channel digits resized to 100, 224 and 500 pixels, 10
classes. Each (size, mode, memory format) runs in its own subprocess (own CUDA context,
own memory peak, own Inductor cache). Modes: eager, compile (Inductor, default mode),
compile-reduce-overhead (Inductor with CUDA graphs); memory formats: contiguous (NCHW)
and channels_last. Precision (--precision): fp32 (TF32 off for matmuls and cuDNN
convolutions unless --tf32, to compare with tunegraph's allow_tf32 = false), bf16 (autocast
over fp32 weights) or fp16 (autocast over fp32 weights with torch.amp.GradScaler's dynamic
loss scaling: the scaled loss's backward, unscale_ before the clipping, scaler.step and
scaler.update; fused AdamW takes the scale and the overflow flag itself), as tunegraph's
precision = fp32 | bf16 | fp16 (bench/jobs/mobilenet-v2-b64-sSIZE[-bf16|-fp16].job).

The model is torchvision.models.mobilenet_v2(num_classes=10) with the stem taking the
image's channels; where torchvision is not installed, an equal definition below (the same
modules in the same order, so the same parameters and FLOPs).

Usage
  python3 bench/pytorch_mobilenet.py --sizes 100,224,500 --out r.json
  python3 bench/pytorch_mobilenet.py --sizes 224 --modes eager --formats channels_last --out r.json
  python3 bench/pytorch_mobilenet.py --sizes 224 --precision fp16 --formats channels_last --out r.json
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

MODES = ["eager", "compile", "compile-reduce-overhead"]
FORMATS = ["contiguous", "channels_last"]
LR = 1e-3
WEIGHT_DECAY = 0.01
MAX_GRAD_NORM = 1.0
N_INPUT_BATCHES = 4


def log(*a):
    print(*a, flush=True)


def make_divisible(v, d=8):
    n = max(d, int(v + d / 2) // d * d)
    if n < 0.9 * v:
        n += d
    return n


def local_mobilenet_v2(num_classes, channels, width_mult=1.0):
    """torchvision's MobileNetV2 (features.0 .. features.18, classifier Dropout(0.2) + Linear)."""
    import torch.nn as nn

    def conv_bn(inp, oup, k, s, groups=1):
        return nn.Sequential(nn.Conv2d(inp, oup, k, s, (k - 1) // 2, groups=groups, bias=False),
                             nn.BatchNorm2d(oup), nn.ReLU6(inplace=True))

    class InvertedResidual(nn.Module):
        def __init__(self, inp, oup, stride, t):
            super().__init__()
            hidden = inp * t
            self.use_res = stride == 1 and inp == oup
            layers = []
            if t != 1:
                layers.append(conv_bn(inp, hidden, 1, 1))
            layers += [conv_bn(hidden, hidden, 3, stride, groups=hidden),
                       nn.Conv2d(hidden, oup, 1, 1, 0, bias=False), nn.BatchNorm2d(oup)]
            self.conv = nn.Sequential(*layers)

        def forward(self, x):
            return x + self.conv(x) if self.use_res else self.conv(x)

    class MobileNetV2(nn.Module):
        def __init__(self):
            super().__init__()
            settings = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                        (6, 320, 1, 1)]
            inp = make_divisible(32 * width_mult)
            last = make_divisible(1280 * max(1.0, width_mult))
            feats = [conv_bn(channels, inp, 3, 2)]
            for t, c, n, s in settings:
                out = make_divisible(c * width_mult)
                for i in range(n):
                    feats.append(InvertedResidual(inp, out, s if i == 0 else 1, t))
                    inp = out
            feats.append(conv_bn(inp, last, 1, 1))
            self.features = nn.Sequential(*feats)
            self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last, num_classes))

        def forward(self, x):
            x = self.features(x)
            x = nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)
            return self.classifier(x)

    return MobileNetV2()


def build_model(channels, num_classes):
    try:
        import torchvision
        import torch.nn as nn
        m = torchvision.models.mobilenet_v2(num_classes=num_classes)
        if channels != 3:
            old = m.features[0][0]
            m.features[0][0] = nn.Conv2d(channels, old.out_channels, 3, 2, 1, bias=False)
        return m, f"torchvision {torchvision.__version__}"
    except ImportError:
        return local_mobilenet_v2(num_classes, channels), "local definition (torchvision not installed)"


def run_one(size, mode, fmt, batch, channels, precision, tf32, steps, warmup):
    import torch
    torch.backends.cuda.matmul.allow_tf32 = bool(tf32)
    torch.backends.cudnn.allow_tf32 = bool(tf32)
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    torch.manual_seed(0)
    res = dict(size=size, mode=mode, format=fmt, batch=batch, channels=channels, precision=precision, tf32=bool(tf32),
               steps=steps, warmup=warmup, torch=torch.__version__, device=torch.cuda.get_device_name(0))
    t0 = time.perf_counter()
    model, source = build_model(channels, 10)
    res["model_source"] = source
    mf = torch.channels_last if fmt == "channels_last" else torch.contiguous_format
    model = model.to(dev, memory_format=mf)
    model.train()
    params = list(model.parameters())
    res["n_params"] = sum(p.numel() for p in params)
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=WEIGHT_DECAY, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    fwd = model
    if mode == "compile":
        fwd = torch.compile(model)
    elif mode == "compile-reduce-overhead":
        fwd = torch.compile(model, mode="reduce-overhead")
    g = torch.Generator(device="cpu").manual_seed(1234)
    batches = [(torch.randn(batch, channels, size, size, generator=g).to(dev, memory_format=mf),
                torch.randint(0, 10, (batch,), generator=g).to(dev)) for _ in range(N_INPUT_BATCHES)]
    loss_fn = torch.nn.CrossEntropyLoss()
    use_cg = mode == "compile-reduce-overhead"
    amp = precision in ("bf16", "fp16")
    amp_dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    # fp16: dynamic loss scaling (init 2^16, growth 2 every 2000 steps, backoff 0.5: tunegraph's defaults).
    scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None

    def step(i):
        if use_cg:
            torch.compiler.cudagraph_mark_step_begin()
        x, y = batches[i % len(batches)]
        with torch.autocast("cuda", dtype=amp_dtype, enabled=amp):
            loss = loss_fn(fwd(x), y)
        if scaler is None:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, max_norm=MAX_GRAD_NORM)
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(params, max_norm=MAX_GRAD_NORM)
            scaler.step(opt)
            scaler.update()
        sched.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for i in range(max(1, warmup)):
        w0 = time.perf_counter()
        loss = step(i)
        torch.cuda.synchronize()
        if i == 0:
            res["first_step_s"] = time.perf_counter() - w0
            res["first_loss"] = float(loss.item())
    res["warmup_total_s"] = time.perf_counter() - t0
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
    for i in range(steps):
        evs[i][0].record()
        loss = step(warmup + i)
        evs[i][1].record()
        torch.cuda.synchronize()
    ms = [a.elapsed_time(b) for a, b in evs]
    res["peak_mem_bytes"] = torch.cuda.max_memory_allocated()
    # Pipelined: no per-step sync, one event pair around all steps.
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for i in range(steps):
        loss = step(warmup + steps + i)
    e1.record()
    torch.cuda.synchronize()
    res["step_ms_median"] = statistics.median(ms)
    res["step_ms_min"] = min(ms)
    res["pipelined_step_ms"] = e0.elapsed_time(e1) / steps
    res["images_per_s"] = batch / (min(res["step_ms_median"], res["pipelined_step_ms"]) / 1e3)
    res["final_loss"] = float(loss.item())
    if scaler is not None:
        res["loss_scale"] = float(scaler.get_scale())
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100,224,500")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--channels", type=int, default=1)
    ap.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    ap.add_argument("--tf32", type=int, default=0)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out", required=True)
    ap.add_argument("--one", help=argparse.SUPPRESS)  # size:mode:format, in the child
    a = ap.parse_args()
    if a.one:
        size, mode, fmt = a.one.split(":")
        try:
            r = run_one(int(size), mode, fmt, a.batch, a.channels, a.precision, a.tf32, a.steps, a.warmup)
        except Exception as e:  # recorded, so the other combinations still run
            r = dict(size=int(size), mode=mode, format=fmt, precision=a.precision, error=f"{type(e).__name__}: {e}",
                     traceback=traceback.format_exc())
        with open(a.out, "w") as f:
            json.dump(r, f)
        return
    results = []
    for size in [int(s) for s in a.sizes.split(",")]:
        for mode in a.modes.split(","):
            for fmt in a.formats.split(","):
                with tempfile.TemporaryDirectory() as tmp:
                    out = os.path.join(tmp, "r.json")
                    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"),
                               TRITON_CACHE_DIR=os.path.join(tmp, "triton"))
                    cmd = [sys.executable, __file__, "--one", f"{size}:{mode}:{fmt}", "--batch", str(a.batch),
                           "--channels", str(a.channels), "--precision", a.precision, "--tf32", str(a.tf32),
                           "--steps", str(a.steps), "--warmup", str(a.warmup), "--out", out]
                    log(f"== {size}px {mode} {fmt} {a.precision}")
                    p = subprocess.run(cmd, env=env)
                    try:
                        with open(out) as f:
                            r = json.load(f)
                    except OSError:
                        r = dict(size=size, mode=mode, format=fmt, precision=a.precision,
                                 error=f"child exited {p.returncode}")
                results.append(r)
                if "error" in r:
                    log(f"   {a.precision} error: {r['error']}")
                else:
                    scale = f", loss scale {r['loss_scale']:g}" if "loss_scale" in r else ""
                    log(f"   {a.precision}: {r['step_ms_median']:.2f} ms a step (pipelined {r['pipelined_step_ms']:.2f}), "
                        f"{r['images_per_s']:.0f} images/s, peak {r['peak_mem_bytes'] / 2**30:.2f} GiB{scale}")
                with open(a.out, "w") as f:
                    json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
