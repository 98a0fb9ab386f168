#!/usr/bin/env python3
"""PyTorch DistributedDataParallel baseline for tunegraph's data-parallel scaling runs.

The training step of bench/pytorch_baseline.py (HF transformers model, bf16 autocast over
fp32 master weights, clip_grad_norm_, fused AdamW, linear schedule) on WORLD GPUs of one
host, one process per GPU, each with `batch` rows of its own (the per-GPU batch of the
case), gradients summed by DDP (NCCL, 25 MB buckets overlapping the backward).

Usage
  python3 bench/pytorch_ddp.py --case bert-base-cls-b32-t128 --world 1,2,4,8 --out ddp.json
  python3 bench/pytorch_ddp.py --case gpt2-lm-b16-t1024 --world 2 --mode compile --out ddp.json

Modes: eager, compile (torch.compile of the DDP module), compile-reduce-overhead (with CUDA
graphs; where DDP's hooks keep it from capturing, the error is recorded).

Worlds larger than the GPUs present are skipped (recorded as such). NVLink multicast stays
off (NCCL_NVLS_ENABLE=0, as on the shared machines). Rank 0 times the steps: the median of
CUDA-event step times with a barrier and synchronisation around every step, and the
pipelined time of steps queued back to back.
"""

import argparse
import datetime as _dt
import json
import os
import socket
import statistics
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pytorch_baseline as base  # noqa: E402  (models, batches, constants)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, world, args, port, queue):
    import torch
    import torch.distributed as dist

    try:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        spec = base.CASES[args.case]
        kind, batch, seq = spec["model"], spec["batch"], spec["seq"]
        dev = torch.device("cuda", rank)
        torch.manual_seed(base.INIT_SEED)
        t0 = time.perf_counter()
        model, config, _ = base.build_model(kind)
        model.to(dev).train()
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank], bucket_cap_mb=25,
                                                        gradient_as_bucket_view=True)
        use_cg = args.mode == "compile-reduce-overhead"
        fwd = (torch.compile(ddp, mode="reduce-overhead") if use_cg
               else torch.compile(ddp) if args.mode == "compile" else ddp)
        opt = torch.optim.AdamW(model.parameters(), lr=base.LR, weight_decay=base.WEIGHT_DECAY, fused=True)
        total = args.warmup + 2 * args.steps
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, total // 10)))
        # Each rank its own batches: the data seed offset by the rank.
        base.DATA_SEED += rank
        batches = base.make_batches(kind, batch, seq, config.vocab_size, dev)
        params = list(model.parameters())

        def step(i):
            if use_cg:
                torch.compiler.cudagraph_mark_step_begin()
            b = batches[i % len(batches)]
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = fwd(**b).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, max_norm=base.MAX_GRAD_NORM)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            return loss

        for i in range(max(1, args.warmup)):
            loss = step(i)
        torch.cuda.synchronize()
        warmup_s = time.perf_counter() - t0
        dist.barrier()
        ms = []
        for i in range(args.steps):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            loss = step(args.warmup + i)
            e1.record()
            torch.cuda.synchronize()
            ms.append(e0.elapsed_time(e1))
            dist.barrier()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for i in range(args.steps):
            loss = step(args.warmup + args.steps + i)
        e1.record()
        torch.cuda.synchronize()
        pipelined = e0.elapsed_time(e1) / args.steps
        if rank == 0:
            med = statistics.median(ms)
            queue.put(dict(world=world, step_ms_median=med, pipelined_step_ms=pipelined,
                           tokens_per_s=world * batch * seq / (pipelined / 1e3), warmup_s=warmup_s,
                           final_loss=float(loss.detach().float().item()),
                           peak_reserved_bytes=torch.cuda.max_memory_reserved()))
        dist.destroy_process_group()
    except Exception:
        queue.put(dict(world=world, rank=rank, error=traceback.format_exc()))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", choices=list(base.CASES), required=True)
    ap.add_argument("--world", default="1,2,4,8", help="comma-separated GPU counts")
    ap.add_argument("--mode", choices=["eager", "compile", "compile-reduce-overhead"], default="eager")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

    import torch
    import torch.multiprocessing as mp

    gpus = torch.cuda.device_count()
    doc = dict(tool="pytorch_ddp", case=args.case, mode=args.mode, steps=args.steps, warmup=args.warmup,
               date=_dt.datetime.now(_dt.timezone.utc).isoformat(), command=" ".join(sys.argv),
               device=torch.cuda.get_device_name(0) if gpus else None, gpus=gpus, torch=torch.__version__,
               results=[])
    for w in [int(x) for x in args.world.split(",") if x]:
        if w > gpus:
            doc["results"].append(dict(world=w, skipped=f"{gpus} GPU(s) present"))
            continue
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        port = free_port()
        procs = [ctx.Process(target=worker, args=(r, w, args, port, queue)) for r in range(w)]
        for p in procs:
            p.start()
        results = []
        for p in procs:
            p.join()
        while not queue.empty():
            results.append(queue.get())
        errors = [r for r in results if "error" in r]
        doc["results"].append(errors[0] if errors else (results[0] if results else dict(world=w, error="no result")))
        print(json.dumps(doc["results"][-1])[:300], flush=True)
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
