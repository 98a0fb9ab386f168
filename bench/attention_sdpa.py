"""PyTorch's scaled_dot_product_attention at bench/attention_kernels.c's shapes, for the
same-call comparison: bf16 [B, H, T, Dh] tensors, forward alone and backward alone (the
gradient of a forward whose graph is kept), each after an L2 flush, median of --reps
runs, TFLOP/s of the FLOPs the attention needs (forward 4 B H T^2 Dh, causal half;
backward 2.5x the forward), as the C benchmark counts them.

    python3 bench/attention_sdpa.py [--reps N] [--backend default|cudnn|flash|efficient]

`default` lets PyTorch choose (cuDNN on an H100 in PyTorch 2.11 for these shapes);
the others force one backend with torch.nn.attention.sdpa_kernel."""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

CASES = [  # name, B, H, T, Dh, causal, dropout: bench/attention_kernels.c's list
    ("gpt2-b16-t1024-d64-causal", 16, 12, 1024, 64, True, 0.0),
    ("gpt2-b16-t1024-d64-causal-drop0.1", 16, 12, 1024, 64, True, 0.1),
    ("bert-b32-t128-d64", 32, 12, 128, 64, False, 0.0),
    ("bert-b32-t128-d64-drop0.1", 32, 12, 128, 64, False, 0.1),
    ("bert-b8-t512-d64", 8, 12, 512, 64, False, 0.0),
    ("bert-b8-t512-d64-drop0.1", 8, 12, 512, 64, False, 0.1),
    ("squad-b32-t384-d64-drop0.1", 32, 12, 384, 64, False, 0.1),
    ("llama-b4-t2048-d128-causal", 4, 32, 2048, 128, True, 0.0),
    ("llama-b2-t4096-d128-causal", 2, 32, 4096, 128, True, 0.0),
]

BACKENDS = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}


def timed(fn, reps, flush):
    ms = []
    for r in range(reps + 2):
        flush.fill_(r & 0xFF)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        torch.cuda.synchronize()
        if r >= 2:
            ms.append(e0.elapsed_time(e1))
    return statistics.median(ms)


def run_case(case, reps, flush):
    name, B, H, T, Dh, causal, p = case
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v, do = (torch.randn(B, H, T, Dh, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal)

    fwd_ms = timed(fwd, reps, flush)
    bwd_ms = []
    for r in range(reps + 2):
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal)
        flush.fill_(r & 0xFF)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        out.backward(do)
        e1.record()
        torch.cuda.synchronize()
        q.grad = k.grad = v.grad = None
        if r >= 2:
            bwd_ms.append(e0.elapsed_time(e1))
    bwd_ms = statistics.median(bwd_ms)
    flops = 4.0 * B * H * T * T * Dh * (0.5 if causal else 1.0)
    ftf, btf = flops / (fwd_ms * 1e-3) / 1e12, 2.5 * flops / (bwd_ms * 1e-3) / 1e12
    print(f"{name:36s} fwd {fwd_ms:8.3f} ms {ftf:7.1f} TFLOP/s   bwd {bwd_ms:8.3f} ms {btf:7.1f} TFLOP/s", flush=True)
    return ftf, btf


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--backend", default="default", choices=["default"] + sorted(BACKENDS))
    args = ap.parse_args()
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, SDPA backend {args.backend}, "
          f"bf16, median of {args.reps} runs, L2 flushed before each")
    rows = []
    for case in CASES:
        try:
            if args.backend == "default":
                rows.append((case, run_case(case, args.reps, flush)))
            else:
                with sdpa_kernel(BACKENDS[args.backend]):
                    rows.append((case, run_case(case, args.reps, flush)))
        except RuntimeError as e:  # a backend that does not take this shape (dropout, say)
            print(f"{case[0]:36s} not run: {str(e).splitlines()[0]}", flush=True)
    print("\n| case | fwd TFLOP/s | bwd TFLOP/s |\n|---|---|---|")
    for case, (ftf, btf) in rows:
        print(f"| {case[0]} | {ftf:.1f} | {btf:.1f} |")


if __name__ == "__main__":
    main()
