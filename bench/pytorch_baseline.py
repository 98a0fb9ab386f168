#!/usr/bin/env python3
"""PyTorch + Hugging Face transformers baseline for tunegraph's training-step benchmark.

One "step" = forward + loss + backward + clip_grad_norm_ + AdamW.step + scheduler.step
+ zero_grad(set_to_none=True), bf16 autocast (or --precision fp16: float16 autocast with
torch.amp.GradScaler) over fp32 master weights, model.train()
(dropout 0.1 as in the HF configs), attn_implementation="sdpa".

Usage
  python3 bench/pytorch_baseline.py --case bert-base-cls-b32-t128 --mode eager --out r.json
  python3 bench/pytorch_baseline.py --all --out r.json
  python3 bench/pytorch_baseline.py --cases bert-base-cls-b32-t128,gpt2-lm-b16-t1024 \
          --modes eager,compile --out r.json

With --all / --cases / --modes, or several combinations, every case x mode runs in its own
fresh subprocess (own CUDA context, own memory peaks, own empty Inductor/Triton cache
directory unless --shared-compile-cache), and a failing combination records its error
instead of aborting the rest.  The combined JSON is rewritten after every combination, so
a run cut short still leaves the finished results.

Models are built from hard-coded configs with random init (no network on the device).

The Llama cases also run in the modes `liger` and `liger-compile`: PyTorch's best configuration
for Llama by the project's rule, HF transformers + Liger kernels (liger-kernel from PyPI:
apply_liger_kernel_to_llama with rope, rms_norm, swiglu and fused_linear_cross_entropy, applied
to the classes before the model is built), without activation recompute.  The device has no
PyPI: bench/fetch_liger.sh unpacks the wheel into build/dev/liger, which travels with the
device call and is put first on sys.path (--liger-path).  `--list` prints what would run and
which liger-kernel would be used, without importing torch.
"""

import argparse
import datetime as _dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

CASES = {
    "bert-base-cls-b32-t128": dict(model="bert-cls", batch=32, seq=128),
    "bert-base-cls-b8-t512": dict(model="bert-cls", batch=8, seq=512),
    "gpt2-lm-b16-t1024": dict(model="gpt2-lm", batch=16, seq=1024),
    # the clinical-notes study's masked-LM shape and SQuAD v2's usual one
    "bert-base-mlm-b4-t512": dict(model="bert-mlm", batch=4, seq=512),
    "bert-base-qa-b32-t384": dict(model="bert-qa", batch=32, seq=384),
    # Llama-3.2-1B full fine-tune at T = 2048
    "llama-3.2-1b-lm-b4-t2048": dict(model="llama-lm", batch=4, seq=2048),
    # Llama-3-8B with LoRA r16 (alpha 32) on all seven projections, the base frozen in bf16
    "llama-3-8b-lora-b1-t4096": dict(model="llama-8b-lora", batch=1, seq=4096),
    "llama-3-8b-lora-b2-t2048": dict(model="llama-8b-lora", batch=2, seq=2048),
}
LORA_R, LORA_ALPHA = 16, 32
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PRECISIONS = ["bf16", "fp16"]
MLM_PROBABILITY = 0.15
MODES = ["eager", "compile", "compile-reduce-overhead", "liger", "liger-compile"]
# HF + Liger kernels: the Llama cases only (apply_liger_kernel_to_llama)
LIGER_MODES = ("liger", "liger-compile")
LLAMA_MODELS = ("llama-lm", "llama-8b-lora")
# apply_liger_kernel_to_llama's switches: every kernel it has for Llama, the loss fused with the
# LM head (no logits materialized), so its plain cross entropy is off
LIGER_KW = dict(rope=True, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=True)
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_LIGER_PATH = os.path.join(REPO_ROOT, "build", "dev", "liger")

LR = 5e-5
WEIGHT_DECAY = 0.01
MAX_GRAD_NORM = 1.0
N_INPUT_BATCHES = 4          # pre-generated on the GPU, rotated
DATA_SEED = 1234
INIT_SEED = 0


def log(*a):
    print(*a, flush=True)


# --------------------------------------------------------------------------------------
# single combination (runs inside the child process)
# --------------------------------------------------------------------------------------

def _percentile(xs, q):
    """Linear-interpolated percentile, q in [0, 100]."""
    s = sorted(xs)
    if not s:
        return float("nan")
    if len(s) == 1:
        return s[0]
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def modes_for_case(case):
    """The modes a case runs in: the Liger modes are for the Llama cases alone."""
    if CASES[case]["model"] in LLAMA_MODELS:
        return list(MODES)
    return [m for m in MODES if m not in LIGER_MODES]


def liger_probe(path):
    """Which liger-kernel a Liger mode would import, read from package metadata alone (no torch):
    the unpacked wheel in `path` when that folder holds one, else an installed package."""
    import importlib.metadata as md

    path = os.path.abspath(path) if path else None
    info = dict(path=path, path_present=bool(path and os.path.isdir(path)), version=None, source=None)
    if info["path_present"]:
        for d in md.distributions(path=[path]):
            if (d.metadata["Name"] or "").lower().replace("_", "-") == "liger-kernel":
                info.update(version=d.version, source="liger-path")
                return info
    try:
        info.update(version=md.version("liger-kernel"), source="installed")
    except md.PackageNotFoundError:
        info["error"] = (f"liger-kernel not found: no unpacked wheel in {path} and none installed; "
                         "run bench/fetch_liger.sh (on a machine with PyPI) and carry build/dev")
    return info


def load_liger(path):
    """Put the unpacked wheel (if present) first on sys.path and import Liger's Llama patch.
    Returns (apply_liger_kernel_to_llama, info); raises with the fix when liger-kernel is missing."""
    info = liger_probe(path)
    if info["path_present"] and info["path"] not in sys.path:
        sys.path.insert(0, info["path"])
    try:
        import liger_kernel
        from liger_kernel.transformers import apply_liger_kernel_to_llama
    except ImportError as e:
        raise RuntimeError(info.get("error") or f"liger-kernel {info['version']} did not import "
                           f"({type(e).__name__}: {e})") from e
    info["file"] = os.path.dirname(liger_kernel.__file__)
    if info["path_present"] and not info["file"].startswith(info["path"] + os.sep):
        raise RuntimeError(f"liger_kernel imported from {info['file']}, not from --liger-path {info['path']}")
    return apply_liger_kernel_to_llama, info


def liger_patch_report(model):
    """What of the model runs Liger's code (raises if a kernel that was asked for is not in it,
    e.g. because a transformers version builds its Llama from other names)."""
    from transformers.models.llama import modeling_llama
    from liger_kernel.transformers.rms_norm import LigerRMSNorm
    from liger_kernel.transformers.swiglu import LigerSwiGLUMLP
    from liger_kernel.transformers.rope import liger_rotary_pos_emb
    from liger_kernel.transformers.model.llama import lce_forward

    n_layers = model.config.num_hidden_layers
    rep = dict(
        rms_norm_modules=sum(isinstance(m, LigerRMSNorm) for m in model.modules()),
        swiglu_modules=sum(isinstance(m, LigerSwiGLUMLP) for m in model.modules()),
        # LlamaAttention.forward calls the module-level apply_rotary_pos_emb
        rope=(modeling_llama.apply_rotary_pos_emb is liger_rotary_pos_emb and
              modeling_llama.LlamaAttention.forward.__globals__ is vars(modeling_llama)),
        fused_linear_cross_entropy=type(model).forward is lce_forward,
    )
    want = dict(rms_norm_modules=2 * n_layers + 1, swiglu_modules=n_layers, rope=True,
                fused_linear_cross_entropy=True)
    bad = {k: (rep[k], v) for k, v in want.items() if rep[k] != v}
    if bad:
        raise RuntimeError(f"Liger's Llama patch did not take (got, wanted): {bad}")
    try:  # which implementation Liger's dispatcher picks for RoPE (Triton unless CuTe DSL is installed)
        from liger_kernel.backends import available_impls
        rep["rope_impls"] = available_impls("rope")
    except Exception as e:
        rep["rope_impls"] = f"n/a ({type(e).__name__})"
    return rep


def build_model(kind, lora_device="cuda"):
    import torch
    import transformers as tf

    if kind in ("bert-cls", "bert-mlm", "bert-qa"):
        # bert-base-uncased values
        cfg_kw = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12,
                      num_attention_heads=12, intermediate_size=3072,
                      hidden_act="gelu", hidden_dropout_prob=0.1,
                      attention_probs_dropout_prob=0.1, max_position_embeddings=512,
                      type_vocab_size=2, initializer_range=0.02, layer_norm_eps=1e-12,
                      pad_token_id=0, num_labels=2)
        cfg_cls = tf.BertConfig
        model_cls = {"bert-cls": tf.BertForSequenceClassification, "bert-mlm": tf.BertForMaskedLM,
                     "bert-qa": tf.BertForQuestionAnswering}[kind]
    elif kind == "gpt2-lm":
        # gpt2 (124M) values
        cfg_kw = dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12,
                      n_head=12, activation_function="gelu_new", resid_pdrop=0.1,
                      embd_pdrop=0.1, attn_pdrop=0.1, layer_norm_epsilon=1e-5,
                      initializer_range=0.02, bos_token_id=50256, eos_token_id=50256,
                      use_cache=False)
        cfg_cls, model_cls = tf.GPT2Config, tf.GPT2LMHeadModel
    elif kind == "llama-lm":
        # meta-llama/Llama-3.2-1B values (tied head, llama3 rope)
        cfg_kw = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=64, hidden_act="silu",
                      max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
                      rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                      tie_word_embeddings=True, attention_dropout=0.0, initializer_range=0.02,
                      bos_token_id=128000, eos_token_id=128001, use_cache=False)
        cfg_cls, model_cls = tf.LlamaConfig, tf.LlamaForCausalLM
    elif kind == "llama-8b-lora":
        # meta-llama/Meta-Llama-3-8B values
        cfg_kw = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, hidden_act="silu",
                      max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=None,
                      tie_word_embeddings=False, attention_dropout=0.0, initializer_range=0.02,
                      bos_token_id=128000, eos_token_id=128001, use_cache=False)
        return build_lora_llama(tf.LlamaConfig(**cfg_kw), tf.LlamaForCausalLM, lora_device)
    else:
        raise ValueError(kind)

    try:
        config = cfg_cls(attn_implementation="sdpa", **cfg_kw)
    except TypeError:
        config = cfg_cls(**cfg_kw)
    try:
        config._attn_implementation = "sdpa"
    except Exception:
        pass
    if hasattr(config, "use_cache"):
        config.use_cache = False
    model = model_cls(config)
    model = model.float()  # fp32 master weights (autocast does the bf16 compute)
    attn_impl = getattr(model.config, "_attn_implementation", None)
    return model, config, attn_impl


def build_lora_llama(config, model_cls, device="cuda"):
    """A Llama built on the GPU in bf16 (the frozen base, as PEFT users load it), then LoRA
    written in plain PyTorch (the device has no PEFT): each target nn.Linear gains fp32 A
    (kaiming-uniform, a = sqrt(5)) and B (zeros), y = base(x) + (alpha / r) B A x.  The targets
    are found by name, so Liger's LigerSwiGLUMLP (which calls self.gate_proj / up_proj /
    down_proj) is wrapped the same as HF's LlamaMLP."""
    import math
    import torch

    class LoRALinear(torch.nn.Module):
        def __init__(self, base, r, alpha):
            super().__init__()
            self.base, self.scale = base, alpha / r
            self.lora_A = torch.nn.Parameter(torch.empty(r, base.in_features, device=base.weight.device))
            self.lora_B = torch.nn.Parameter(torch.zeros(base.out_features, r, device=base.weight.device))
            torch.nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))

        def forward(self, x):
            return self.base(x) + (x.to(self.lora_A.dtype) @ self.lora_A.t() @ self.lora_B.t()).to(x.dtype) * self.scale

    config._attn_implementation = "sdpa"
    with torch.device(device):
        model = model_cls(config).to(torch.bfloat16)
    for p in model.parameters():
        p.requires_grad_(False)
    for name, module in list(model.named_modules()):
        for child, sub in list(module.named_children()):
            if child in LORA_TARGETS and isinstance(sub, torch.nn.Linear):
                setattr(module, child, LoRALinear(sub, LORA_R, LORA_ALPHA))
    return model, config, getattr(model.config, "_attn_implementation", None)


def make_batches(kind, batch, seq, vocab, device):
    import torch

    g = torch.Generator(device="cpu")
    g.manual_seed(DATA_SEED)
    batches = []
    for _ in range(N_INPUT_BATCHES):
        ids = torch.randint(0, vocab, (batch, seq), generator=g, dtype=torch.long)
        mask = torch.ones(batch, seq, dtype=torch.long)  # full attention, no padding
        types = torch.zeros(batch, seq, dtype=torch.long)
        if kind == "bert-cls":
            labels = torch.randint(0, 2, (batch,), generator=g, dtype=torch.long)
            b = dict(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels)
        elif kind == "bert-mlm":
            # DataCollatorForLanguageModeling's rule, applied here once per batch (tunegraph
            # masks inside its step; the baseline is not charged for masking): 15% of
            # positions chosen, of those 80% [MASK] (id 103), 10% a random id, 10% kept.
            chosen = torch.rand(batch, seq, generator=g) < MLM_PROBABILITY
            labels = torch.where(chosen, ids, torch.full_like(ids, -100))
            to_mask = chosen & (torch.rand(batch, seq, generator=g) < 0.8)
            to_random = chosen & ~to_mask & (torch.rand(batch, seq, generator=g) < 0.5)
            masked = torch.where(to_mask, torch.full_like(ids, 103), ids)
            masked = torch.where(to_random, torch.randint(0, vocab, (batch, seq), generator=g), masked)
            b = dict(input_ids=masked, attention_mask=mask, token_type_ids=types, labels=labels)
        elif kind == "bert-qa":
            # a third of the rows unanswerable (start = end = 0, the [CLS] token)
            start = torch.randint(1, seq - 32, (batch,), generator=g, dtype=torch.long)
            end = start + torch.randint(0, 31, (batch,), generator=g, dtype=torch.long)
            none = torch.rand(batch, generator=g) < 1 / 3
            start, end = torch.where(none, 0, start), torch.where(none, 0, end)
            b = dict(input_ids=ids, attention_mask=mask, token_type_ids=types, start_positions=start,
                     end_positions=end)
        else:
            b = dict(input_ids=ids, attention_mask=mask, labels=ids.clone())  # HF shifts
        # host->device copies happen here, once, before anything is timed
        batches.append({k: v.to(device, non_blocking=False) for k, v in b.items()})
    return batches


def run_one(case, mode, steps, warmup, precision="bf16", liger_path=DEFAULT_LIGER_PATH):
    import torch
    import transformers

    spec = CASES[case]
    kind, batch, seq = spec["model"], spec["batch"], spec["seq"]
    dev = torch.device("cuda")
    torch.cuda.init()
    torch.cuda.reset_peak_memory_stats()

    res = dict(case=case, mode=mode, precision=precision, batch=batch, seq=seq, steps=steps,
               warmup_steps=warmup)
    # fp16: autocast float16 with torch.amp.GradScaler's dynamic loss scaling (its defaults:
    # init 65536, growth 2 every 2000 steps, backoff 0.5), as HF Trainer's fp16=True
    amp_dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None

    # Liger: import it and patch transformers' Llama classes (RMSNorm, MLP, rotary function,
    # LlamaForCausalLM.forward) before the model is built; not counted in build_s
    if mode in LIGER_MODES:
        if kind not in LLAMA_MODELS:
            raise ValueError(f"mode {mode} is for the Llama cases only")
        apply_liger, res["liger"] = load_liger(liger_path)
        apply_liger(**LIGER_KW)
        log(f"  liger-kernel {res['liger']['version']} from {res['liger']['file']}: {LIGER_KW}")

    # ---- build (warm-up wall clock starts at model construction) ----
    torch.manual_seed(INIT_SEED)
    torch.cuda.synchronize()
    t_build0 = time.perf_counter()
    model, config, attn_impl = build_model(kind)
    model.to(dev)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    trainable = [p for p in model.parameters() if p.requires_grad]  # all but a LoRA model's frozen base
    opt = torch.optim.AdamW(trainable, lr=LR, weight_decay=WEIGHT_DECAY, fused=True)
    total_steps = warmup + 2 * steps  # warm-up + timed loop + pipelined loop
    sched_warm = max(1, int(0.1 * total_steps))

    def lr_lambda(step):
        if step < sched_warm:
            return float(step + 1) / float(sched_warm)
        return max(0.0, float(total_steps + 1 - step) / float(max(1, total_steps + 1 - sched_warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)

    if mode in ("eager", "liger"):
        fwd = model
    elif mode in ("compile", "liger-compile"):
        fwd = torch.compile(model)
    elif mode == "compile-reduce-overhead":
        fwd = torch.compile(model, mode="reduce-overhead")
    else:
        raise ValueError(mode)
    use_cg = mode == "compile-reduce-overhead"

    # Inputs are generated (fixed seed) and copied to the GPU before any timing.
    batches = make_batches(kind, batch, seq, config.vocab_size, dev)
    torch.cuda.synchronize()
    t_build1 = time.perf_counter()
    log(f"  built {kind}: {n_params / 1e6:.2f}M params, attn={attn_impl}, "
        f"{t_build1 - t_build0:.1f}s")
    if mode in LIGER_MODES:  # fails the run if a kernel asked for is not in the model
        res["liger"]["patched"] = liger_patch_report(model)
        log(f"  liger in the model: {res['liger']['patched']}")

    params = trainable

    def step(i):
        if use_cg:
            torch.compiler.cudagraph_mark_step_begin()
        b = batches[i % len(batches)]
        with torch.autocast("cuda", dtype=amp_dtype):
            out = fwd(**b)
        loss = out.loss
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

    # ---- warm-up (compilation happens in step 0; CUDA-graph recording in the next ones) ----
    warm_times = []
    first_loss = None
    for i in range(max(1, warmup)):
        t0 = time.perf_counter()
        loss = step(i)
        torch.cuda.synchronize()
        warm_times.append(time.perf_counter() - t0)
        log(f"  warm-up step {i + 1}/{max(1, warmup)}: {warm_times[-1]:.2f}s")
        if i == 0:
            first_loss = float(loss.detach().float().item())
            res["warmup_s"] = time.perf_counter() - t_build0  # construction start -> end of step 1
    t_warm_end = time.perf_counter()
    res["build_s"] = t_build1 - t_build0
    res["first_step_s"] = warm_times[0]            # step 1 alone (includes compilation)
    res["warmup_step_s"] = warm_times              # every warm-up step (graph recording shows here)
    res["warmup_total_s"] = t_warm_end - t_build0  # construction start -> end of all warm-up
    res["first_loss"] = first_loss
    res["peak_mem_incl_warmup_bytes"] = torch.cuda.max_memory_allocated()
    res["peak_reserved_incl_warmup_bytes"] = torch.cuda.max_memory_reserved()

    # ---- timed loop: synchronize every step ----
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
           for _ in range(steps)]
    wall_ms, launch_cpu_us = [], []
    base = max(1, warmup)
    cpu_loop0 = time.process_time()
    for i in range(steps):
        w0 = time.perf_counter()
        c0 = time.process_time()
        evs[i][0].record()
        loss = step(base + i)
        evs[i][1].record()
        c1 = time.process_time()     # all launches issued (excludes the trailing sync)
        torch.cuda.synchronize()
        w1 = time.perf_counter()
        wall_ms.append((w1 - w0) * 1e3)
        launch_cpu_us.append((c1 - c0) * 1e6)
    cpu_loop1 = time.process_time()
    gpu_ms = [a.elapsed_time(b) for a, b in evs]
    res["peak_mem_bytes"] = torch.cuda.max_memory_allocated()
    res["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()

    med = statistics.median(gpu_ms)
    res["step_ms_median"] = med
    res["step_ms_p10"] = _percentile(gpu_ms, 10)
    res["step_ms_p90"] = _percentile(gpu_ms, 90)
    res["step_ms_min"] = min(gpu_ms)
    res["wall_ms_median"] = statistics.median(wall_ms)
    res["tokens_per_s"] = batch * seq / (med / 1e3)
    # Host CPU time (process_time: all threads of the process, incl. the autograd worker).
    # host_cpu_us_per_step: from step start until the last launch was issued (no trailing sync).
    # host_cpu_us_per_step_incl_sync: whole sync-per-step loop / steps; includes the CPU the
    #   CUDA runtime burns spin-waiting in synchronize(), so it is an upper bound.
    res["host_cpu_us_per_step"] = statistics.median(launch_cpu_us)
    res["host_cpu_us_per_step_mean"] = sum(launch_cpu_us) / len(launch_cpu_us)
    res["host_cpu_us_per_step_incl_sync"] = (cpu_loop1 - cpu_loop0) * 1e6 / steps

    # ---- pipelined loop: no per-step sync (how a real training loop runs; lets the CPU
    #      run ahead of the GPU).  One event pair around all steps. ----
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    w0 = time.perf_counter()
    c0 = time.process_time()
    e0.record()
    for i in range(steps):
        loss = step(base + steps + i)
    e1.record()
    c1 = time.process_time()
    torch.cuda.synchronize()
    w1 = time.perf_counter()
    res["pipelined_step_ms"] = e0.elapsed_time(e1) / steps
    res["pipelined_wall_ms"] = (w1 - w0) * 1e3 / steps
    res["pipelined_host_cpu_us_per_step"] = (c1 - c0) * 1e6 / steps
    res["pipelined_tokens_per_s"] = batch * seq / (res["pipelined_step_ms"] / 1e3)

    final_loss = float(loss.detach().float().item())
    res["final_loss"] = final_loss
    res["final_loss_finite"] = final_loss == final_loss and abs(final_loss) != float("inf")
    res["peak_mem_overall_bytes"] = max(res["peak_mem_incl_warmup_bytes"],
                                        torch.cuda.max_memory_allocated())
    res["n_params"] = n_params
    res["attn_implementation"] = attn_impl
    res["lr_final"] = sched.get_last_lr()[0]
    res["inputs"] = (f"{N_INPUT_BATCHES} pre-generated batches resident on GPU, rotated; "
                     "timed loops exclude host->device input copies")
    res["timed_loop_includes_h2d_input_copies"] = False
    return res


def env_info():
    import torch
    import transformers

    info = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
    }
    # Record (never change) the fp32/TF32 defaults.  Only affects fp32 matmuls outside
    # autocast (e.g. none in the model; the optimizer is elementwise).
    flags = {}
    for name, getter in [
        ("cuda.matmul.allow_tf32", lambda: torch.backends.cuda.matmul.allow_tf32),
        ("cudnn.allow_tf32", lambda: torch.backends.cudnn.allow_tf32),
        ("float32_matmul_precision", lambda: torch.get_float32_matmul_precision()),
        ("cuda.matmul.fp32_precision", lambda: torch.backends.cuda.matmul.fp32_precision),
        ("cuda.matmul.allow_bf16_reduced_precision_reduction",
         lambda: torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction),
        ("cuda.flash_sdp_enabled", lambda: torch.backends.cuda.flash_sdp_enabled()),
        ("cuda.mem_efficient_sdp_enabled", lambda: torch.backends.cuda.mem_efficient_sdp_enabled()),
        ("cuda.cudnn_sdp_enabled", lambda: torch.backends.cuda.cudnn_sdp_enabled()),
    ]:
        try:
            flags[name] = getter()
        except Exception as e:  # attribute missing / deprecated in this version
            flags[name] = f"n/a ({type(e).__name__})"
    info["backend_flags"] = flags
    return info


SETTINGS = {
    "precision": ("--precision bf16: torch.autocast('cuda', dtype=torch.bfloat16); fp16: autocast float16 "
                  "+ torch.amp.GradScaler (unscale_ before clipping); fp32 master weights"),
    "optimizer": f"torch.optim.AdamW(lr={LR}, weight_decay={WEIGHT_DECAY}, fused=True)",
    "grad_clip": f"torch.nn.utils.clip_grad_norm_(max_norm={MAX_GRAD_NORM})",
    "scheduler": "LambdaLR linear warmup (10% of steps) then linear decay",
    "attn_implementation": "sdpa (HF default)",
    "dropout": "0.1 (HF config defaults), model.train()",
    "activation_recompute": "none: no gradient checkpointing in any mode (every case fits without it)",
    "step": "forward+loss+backward+clip+optimizer.step+scheduler.step+zero_grad(set_to_none=True)",
    "timing": ("per step: torch.cuda.Event pair + synchronize each step (GPU ms, wall ms); "
               "pipelined_*: same steps back-to-back with no per-step sync"),
    "inputs": ("random token ids (fixed torch.Generator seed), full attention mask, random "
               "labels (GPT-2: labels=input_ids, HF shifts; MLM: 15% masked 80/10/10 once per batch, "
               "not per step; QA: start/end in the sequence, a third 0 = unanswerable); pre-generated on GPU; timed loops "
               "exclude host->device input copies"),
    "mode_notes": {
        "compile": "torch.compile(model) (Inductor, default mode); optimizer/clip run eagerly",
        "compile-reduce-overhead": ("torch.compile(model, mode='reduce-overhead'): CUDA graphs "
                                    "(cudagraph trees) over fwd/bwd; optimizer/clip/scheduler "
                                    "run eagerly outside the graphs; "
                                    "torch.compiler.cudagraph_mark_step_begin() each step"),
        "liger": ("Llama cases only: HF transformers + Liger kernels, eager. "
                  f"apply_liger_kernel_to_llama({', '.join(f'{k}={v}' for k, v in LIGER_KW.items())}) "
                  "on transformers' Llama classes before the model is built: LigerRMSNorm, "
                  "liger_rotary_pos_emb, LigerSwiGLUMLP, and Liger's LlamaForCausalLM.forward, whose loss is "
                  "LigerFusedLinearCrossEntropy over the final hidden states and lm_head.weight "
                  "(no logits materialized); LoRA wraps LigerSwiGLUMLP's projections like LlamaMLP's"),
        "liger-compile": "the same as liger, then torch.compile(model) (Inductor, default mode)",
    },
    "best": ("per case, the mode with the lowest pipelined_step_ms among those that finished; for the "
             "Llama cases among the Liger modes (the project's rule: HF + Liger, no activation recompute), "
             "fastest_any over every mode beside it"),
}


def child_main(args):
    """Run one case x mode; write {"env":..., "result":...} to args.out."""
    res = None
    try:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("CUDA not available")
        res = run_one(args.case, args.mode, args.steps, args.warmup, args.precision, args.liger_path)
    except Exception as e:
        res = dict(case=args.case, mode=args.mode, batch=CASES.get(args.case, {}).get("batch"),
                   seq=CASES.get(args.case, {}).get("seq"), steps=args.steps,
                   error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-4000:])
        log(res["traceback"])
    try:
        env = env_info()
    except Exception as e:
        env = {"env_error": repr(e)}
    return env, res


# --------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------

def fmt(v, spec):
    if v is None:
        return "-"
    try:
        return format(v, spec)
    except Exception:
        return str(v)


def print_table(results):
    hdr = (f"{'case':<24} {'mode':<24} {'ms med':>8} {'p10':>8} {'p90':>8} {'pipe ms':>8} "
           f"{'wall ms':>8} {'tok/s':>10} {'cpu us':>9} {'peak GiB':>8} {'warm s':>7} {'loss':>7}")
    log(hdr)
    log("-" * len(hdr))
    for r in results:
        if r.get("error"):
            log(f"{r['case']:<24} {r['mode']:<24} ERROR: {r['error'][:100]}")
            continue
        log(f"{r['case']:<24} {r['mode']:<24} {fmt(r.get('step_ms_median'), '8.2f')} "
            f"{fmt(r.get('step_ms_p10'), '8.2f')} {fmt(r.get('step_ms_p90'), '8.2f')} "
            f"{fmt(r.get('pipelined_step_ms'), '8.2f')} {fmt(r.get('wall_ms_median'), '8.2f')} "
            f"{fmt(r.get('tokens_per_s'), '10.0f')} {fmt(r.get('host_cpu_us_per_step'), '9.0f')} "
            f"{fmt((r.get('peak_mem_bytes') or 0) / 2**30, '8.2f')} "
            f"{fmt(r.get('warmup_s'), '7.1f')} {fmt(r.get('final_loss'), '7.3f')}")


def best_by_case(results):
    """Per case: the fastest finished mode by pipelined_step_ms, among the Liger modes for the
    Llama cases (the project's rule for PyTorch's best on Llama), and over every mode."""
    def pick(rs):
        if not rs:
            return None
        r = min(rs, key=lambda r: r["pipelined_step_ms"])
        return {k: r.get(k) for k in ("mode", "pipelined_step_ms", "step_ms_median", "pipelined_tokens_per_s",
                                      "peak_mem_bytes")}

    out = {}
    for case in dict.fromkeys(r["case"] for r in results):
        ok = [r for r in results if r["case"] == case and not r.get("error") and r.get("pipelined_step_ms")]
        llama = CASES[case]["model"] in LLAMA_MODELS
        entry = dict(best=pick([r for r in ok if r["mode"] in LIGER_MODES] if llama else ok),
                     fastest_any=pick(ok))
        if llama:
            entry["best_from"] = "liger modes (HF + Liger kernels, no activation recompute)"
            if entry["best"] is None:
                entry["note"] = "no Liger mode finished for this case: PyTorch's best for it is not measured"
        out[case] = entry
    return out


def print_best(best):
    for case, e in best.items():
        b, f = e.get("best"), e.get("fastest_any")
        line = f"best {case:<24} " + (f"{b['mode']} {b['pipelined_step_ms']:.2f} ms pipelined" if b else
                                       "NONE (" + e.get("note", "no mode finished") + ")")
        if f and b and f["mode"] != b["mode"]:
            line += f"; fastest of any mode: {f['mode']} {f['pipelined_step_ms']:.2f} ms"
        log(line)


def write_json(path, doc):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2, default=str)
    os.replace(tmp, path)


def driver_main(args, combos):
    t_start = time.perf_counter()
    doc = {
        "device": None, "torch": None, "transformers": None, "cuda": None,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": sys.argv,
        "settings": SETTINGS,
        "isolation": ("each case x mode in a fresh subprocess"
                      + ("" if args.shared_compile_cache else
                         "; fresh empty TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR each (cold compile)")),
        "liger": liger_probe(args.liger_path),
        "results": [],
    }
    liger_missing = doc["liger"]["version"] is None
    if liger_missing and any(m in LIGER_MODES for _, m in combos):
        log("!" * 100)
        log(f"ERROR: the Liger modes were asked for, but {doc['liger']['error']}.")
        log("       Those combinations are recorded as errors and not run; the others run.")
        log("!" * 100)
    elif any(m in LIGER_MODES for _, m in combos):
        log(f"liger-kernel {doc['liger']['version']} ({doc['liger']['source']}: "
            f"{doc['liger']['path'] if doc['liger']['source'] == 'liger-path' else 'site-packages'})")
    script = os.path.abspath(__file__)
    for idx, (case, mode) in enumerate(combos):
        elapsed = time.perf_counter() - t_start
        remaining = args.deadline_s - elapsed
        if remaining < 30:
            r = dict(case=case, mode=mode, batch=CASES[case]["batch"], seq=CASES[case]["seq"],
                     steps=args.steps,
                     error=f"skipped: --deadline-s {args.deadline_s} reached after {elapsed:.0f}s")
            doc["results"].append(r)
            log(f"[{idx + 1}/{len(combos)}] {case} {mode}: SKIPPED (deadline)")
            write_json(args.out, doc)
            continue
        if mode in LIGER_MODES and liger_missing:
            r = dict(case=case, mode=mode, batch=CASES[case]["batch"], seq=CASES[case]["seq"],
                     steps=args.steps, error=f"not run: {doc['liger']['error']}")
            doc["results"].append(r)
            doc["best"] = best_by_case(doc["results"])
            log(f"[{idx + 1}/{len(combos)}] {case} {mode}: ERROR liger-kernel missing")
            write_json(args.out, doc)
            continue
        timeout = min(args.child_timeout_s, remaining - 10)
        log(f"[{idx + 1}/{len(combos)}] {case} {mode} (t={elapsed:.0f}s, timeout {timeout:.0f}s)")
        cache_dir = None
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        if not args.shared_compile_cache:
            cache_dir = tempfile.mkdtemp(prefix="tg_bench_cache_")
            env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_dir, "inductor")
            env["TRITON_CACHE_DIR"] = os.path.join(cache_dir, "triton")
        fd, child_out = tempfile.mkstemp(prefix="tg_bench_", suffix=".json")
        os.close(fd)
        cmd = [sys.executable, script, "--child", "--case", case, "--mode", mode, "--precision", args.precision,
               "--steps", str(args.steps), "--warmup", str(args.warmup), "--out", child_out,
               "--liger-path", args.liger_path]
        t0 = time.perf_counter()
        r = None
        sys.stdout.flush()
        try:
            # child output streams straight through (unbuffered); its result comes back
            # through child_out, including a caught exception's traceback
            p = subprocess.run(cmd, env=env, timeout=timeout)
            try:
                with open(child_out) as f:
                    child = json.load(f)
                r = child["result"]
                for k in ("device", "torch", "transformers", "cuda", "cudnn", "backend_flags"):
                    if child.get("env", {}).get(k) is not None and doc.get(k) is None:
                        doc[k] = child["env"][k]
            except Exception as e:
                r = dict(case=case, mode=mode, error=f"child exited rc={p.returncode} without "
                         f"result ({type(e).__name__}: {e}); see console output")
        except subprocess.TimeoutExpired:
            r = dict(case=case, mode=mode, error=f"timeout after {timeout:.0f}s (child killed)")
        finally:
            try:
                os.unlink(child_out)
            except OSError:
                pass
            if cache_dir:
                shutil.rmtree(cache_dir, ignore_errors=True)
        r.setdefault("batch", CASES[case]["batch"])
        r.setdefault("seq", CASES[case]["seq"])
        r.setdefault("steps", args.steps)
        r["subprocess_s"] = time.perf_counter() - t0
        doc["results"].append(r)
        if r.get("error"):
            log(f"    -> ERROR {r['error'][:200]}")
        else:
            log(f"    -> {r['step_ms_median']:.2f} ms/step (p10 {r['step_ms_p10']:.2f}, "
                f"p90 {r['step_ms_p90']:.2f}), pipelined {r['pipelined_step_ms']:.2f} ms, "
                f"{r['tokens_per_s']:.0f} tok/s, cpu {r['host_cpu_us_per_step']:.0f} us/step, "
                f"peak {r['peak_mem_bytes'] / 2**30:.2f} GiB, warm-up {r['warmup_s']:.1f}s, "
                f"loss {r['final_loss']:.4f}  [{r['subprocess_s']:.0f}s]")
        doc["best"] = best_by_case(doc["results"])
        write_json(args.out, doc)
    doc["total_s"] = time.perf_counter() - t_start
    write_json(args.out, doc)
    log("")
    log(f"device={doc['device']} torch={doc['torch']} transformers={doc['transformers']} "
        f"cuda={doc['cuda']}  total {doc['total_s']:.0f}s  -> {args.out}")
    print_table(doc["results"])
    print_best(doc.get("best") or {})
    return 0 if all(not r.get("error") for r in doc["results"]) else 1


def parse_list(s, valid, what):
    if not s:
        return None
    items = [x.strip() for x in s.split(",") if x.strip()]
    for x in items:
        if x not in valid:
            raise SystemExit(f"unknown {what} {x!r}; valid: {', '.join(valid)}")
    return items


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", choices=list(CASES))
    ap.add_argument("--mode", choices=MODES)
    ap.add_argument("--cases", help="comma-separated list of cases")
    ap.add_argument("--modes", help="comma-separated list of modes")
    ap.add_argument("--all", action="store_true", help="every case x mode")
    ap.add_argument("--precision", choices=PRECISIONS, default="bf16",
                    help="autocast dtype: bf16, or fp16 with GradScaler (default bf16)")
    ap.add_argument("--steps", type=int, default=30, help="timed steps (default 30)")
    ap.add_argument("--warmup", type=int, default=5, help="warm-up steps (default 5)")
    ap.add_argument("--out", help="output JSON file (required unless --list)")
    ap.add_argument("--liger-path", default=DEFAULT_LIGER_PATH,
                    help="folder holding the unpacked liger-kernel wheel, put first on sys.path by the Liger "
                         "modes (default build/dev/liger in the repository, made by bench/fetch_liger.sh); "
                         "when absent, an installed liger-kernel is used if there is one")
    ap.add_argument("--list", action="store_true",
                    help="print the case x mode combinations the other options select and the liger-kernel "
                         "that the Liger modes would use, then exit (imports no torch)")
    ap.add_argument("--deadline-s", type=float, default=570.0,
                    help="driver: skip combinations that would start after this many seconds "
                         "(default 570, fits a 600 s device command)")
    ap.add_argument("--child-timeout-s", type=float, default=300.0,
                    help="driver: per-combination timeout (default 300)")
    ap.add_argument("--shared-compile-cache", action="store_true",
                    help="driver: let children share the default Inductor/Triton caches "
                         "(warm compile) instead of a fresh empty cache dir each")
    ap.add_argument("--in-process", action="store_true",
                    help="single --case/--mode only: run in this process (no subprocess)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.steps < 1 or args.warmup < 1:
        raise SystemExit("--steps and --warmup must be >= 1")
    if not args.out and not args.list:
        raise SystemExit("--out is required (or --list)")

    if args.child:
        env, res = child_main(args)
        write_json(args.out, {"env": env, "result": res})
        return 0

    cases = parse_list(args.cases, list(CASES), "case")
    modes = parse_list(args.modes, MODES, "mode")
    if args.all:
        cases = cases or list(CASES)
        modes = modes or list(MODES)
    else:
        if args.case:
            cases = (cases or []) + [args.case]
        if args.mode:
            modes = (modes or []) + [args.mode]
        if not cases and not modes:
            if not args.list:
                raise SystemExit("give --case/--mode, --cases/--modes, or --all")
        cases = cases or list(CASES)
        modes = modes or list(MODES)
    cases = list(dict.fromkeys(cases))
    modes = list(dict.fromkeys(modes))
    combos = [(c, m) for c in cases for m in modes if m in modes_for_case(c)]
    dropped = [(c, m) for c in cases for m in modes if m not in modes_for_case(c)]
    if dropped and (args.modes or args.mode):
        log(f"not run (the Liger modes are for the Llama cases): {', '.join(f'{c} {m}' for c, m in dropped)}")
    if not combos:
        raise SystemExit("no case x mode combination to run")

    if args.list:
        for c, m in combos:
            log(f"{c} {m}")
        probe = liger_probe(args.liger_path)
        log(f"liger: {json.dumps(probe)}")
        if probe["version"] is None and any(m in LIGER_MODES for _, m in combos):
            log(f"ERROR: {probe['error']}")
            return 1
        return 0

    if args.in_process:
        if len(combos) != 1:
            raise SystemExit("--in-process needs exactly one case and one mode")
        args.case, args.mode = combos[0]
        env, res = child_main(args)
        doc = dict(env)
        doc.update(date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                   command=sys.argv, settings=SETTINGS, liger=liger_probe(args.liger_path), results=[res])
        write_json(args.out, doc)
        print_table([res])
        return 0 if not res.get("error") else 1
    return driver_main(args, combos)


if __name__ == "__main__":
    sys.exit(main())
