#!/usr/bin/env python3
"""HF transformers under automatic mixed precision (fp16) on the GPU, for tunegraph's
precision = fp16 plans.

Usage:  python3 tests/golden/make_golden_fp16.py DATADIR [CASE...]

For each case (bert_classify, gpt2_lm, bert_mlm; all when none is named) that
make_golden.py already wrote into DATADIR/<case>, loads that case's model folder and inputs
(its golden.safetensors: the same weights and batch as the fp32 golden), runs one forward
under torch.autocast("cuda", dtype=torch.float16) and the backward of the loss scaled as
torch.amp.GradScaler scales it at its default initial scale (2^16), then unscales the
gradients, and writes
  DATADIR/<case>/golden_fp16.safetensors  logits, loss, grad.<parameter> (float32)
  DATADIR/<case>/meta_fp16.json           versions, the GPU, the loss scale, what differs
                                          from the fp32 golden (largest relative errors)
Needs a CUDA GPU, torch and transformers; no network. Fails loudly (non-zero exit) if a
gradient overflows at that scale, a value is not finite, or the autocast loss is not
within 1e-2 of the fp32 golden's.
"""

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
import transformers
from safetensors.torch import load_file, save_file

CASES = ["bert_classify", "gpt2_lm", "bert_mlm"]
LOSS_SCALE = 65536.0  # torch.amp.GradScaler's default init_scale


def check(cond, msg):
    if not cond:
        raise SystemExit("make_golden_fp16: " + msg)


def rel_err(a, b):
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def run_case(datadir, name):
    case_dir = os.path.join(datadir, name)
    meta = json.load(open(os.path.join(case_dir, "meta.json")))
    gold = load_file(os.path.join(case_dir, "golden.safetensors"))
    cls = getattr(transformers, meta["model_class"])
    model = cls.from_pretrained(case_dir, attn_implementation="eager").to("cuda", torch.float32)
    model.train()  # every dropout is 0 in these configs: train equals eval
    named = list(model.named_parameters())
    check([n for n, _ in named] == meta["param_names"], "%s: parameter names differ from meta.json" % name)

    dev = lambda k: gold[k].to("cuda")
    ids, mask = dev("input_ids").long(), dev("attention_mask")
    kw = dict(input_ids=ids, attention_mask=mask)
    if "token_type_ids" in gold:
        kw["token_type_ids"] = dev("token_type_ids").long()
    task = meta["task"]
    if task == "lm":  # HF shifts the labels itself: the ids, with padding ignored
        labels = ids.clone()
        labels[mask == 0] = -100
        kw["labels"] = labels
    elif task == "mlm":  # the step-0 masks the fp32 golden used
        kw["input_ids"] = dev("mlm_input_ids")[0].long()
        kw["labels"] = dev("mlm_labels")[0].long()
    else:
        kw["labels"] = dev("labels").long()

    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.float16):
        out = model(**kw)
    loss = out.loss.float()
    (loss * LOSS_SCALE).backward()
    grads = {}
    for n, p in named:
        g = torch.zeros_like(p) if p.grad is None else p.grad / LOSS_SCALE
        check(torch.isfinite(g).all().item(), "%s: gradient of %s overflowed at scale %g" % (name, n, LOSS_SCALE))
        grads[n] = g.float().cpu().contiguous()
    logits = out.logits.float().cpu().contiguous()
    check(torch.isfinite(logits).all().item(), "%s: non-finite logits" % name)
    loss_cpu = loss.detach().cpu().reshape(1).contiguous()
    check(abs(loss_cpu.item() - gold["loss"].item()) <= 1e-2 * abs(gold["loss"].item()),
          "%s: autocast loss %.7g, fp32 %.7g" % (name, loss_cpu.item(), gold["loss"].item()))

    golden = {"logits": logits, "loss": loss_cpu}
    for n in grads:
        golden["grad." + n] = grads[n]
    save_file(golden, os.path.join(case_dir, "golden_fp16.safetensors"), metadata={"case": name})

    # Leaving out gradients that are 0 in exact arithmetic (attention key biases: noise on
    # both sides, below 1e-7 of the largest element).
    top = max(float(gold["grad." + n].abs().max()) for n in grads)
    worst = max((rel_err(grads[n], gold["grad." + n]), n) for n in grads
                if float(gold["grad." + n].abs().max()) >= 1e-7 * top)
    info = {
        "case": name,
        "autocast": "torch.autocast('cuda', dtype=torch.float16), eager attention",
        "loss_scale": LOSS_SCALE,
        "device": torch.cuda.get_device_name(0),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "loss": loss_cpu.item(),
        "loss_fp32": gold["loss"].item(),
        "logits_rel_err_vs_fp32": rel_err(logits, gold["logits"]),
        "worst_grad_rel_err_vs_fp32": {"param": worst[1], "rel_err": worst[0]},
    }
    with open(os.path.join(case_dir, "meta_fp16.json"), "w") as f:
        json.dump(info, f, indent=1)
        f.write("\n")
    print("%s: loss %.7g (fp32 %.7g), logits %.3g and worst gradient %.3g (%s) from fp32"
          % (name, info["loss"], info["loss_fp32"], info["logits_rel_err_vs_fp32"], worst[0], worst[1]))


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        sys.exit(2)
    datadir, names = sys.argv[1], sys.argv[2:] or CASES
    check(not set(names) - set(CASES), "unknown cases %s (known: %s)" % (sorted(set(names) - set(CASES)), CASES))
    check(torch.cuda.is_available(), "needs a CUDA GPU (autocast fp16 runs there)")
    torch.manual_seed(0)
    for name in names:
        run_case(datadir, name)
    print("OK")


if __name__ == "__main__":
    main()
