#!/usr/bin/env python3
"""Loads a folder written by `tunegraph export` with transformers and checks that its
logits equal tunegraph's on the same examples.

    python3 tests/golden/check_hf_export.py FOLDER LOGITS.jsonl [--device cuda|cpu]
                                            [--dtype fp32|bf16] [--atol A] [--rtol R]

FOLDER is the exported Hugging Face folder; LOGITS.jsonl is `tunegraph predict`'s output:
one JSON object per example with its "input_ids" (as the plan saw them, cut to its
sequence length; a masked LM's as its eval masked them), "token_type_ids" where the data
had them, and "logits" (classification: one row of num_labels values; LM and masked LM:
one row of vocab_size values per token; question answering: a start and an end logit per
token).

The folder is loaded with AutoModelForSequenceClassification, AutoModelForCausalLM when
config.json's architecture is an LM head, AutoModelForMaskedLM for a masked-LM head, or
AutoModelForQuestionAnswering for a ...ForQuestionAnswering (whose start_logits and
end_logits are compared stacked per token), from local files only. The load must find
every parameter and use every tensor (no missing, unexpected or mismatched keys). Each
example runs alone, unpadded, with an all-ones attention mask; HF derives the positions
itself (RoBERTa's from the padding id). An element passes when |hf - tunegraph| <=
atol + rtol * |tunegraph|: 1e-4 and 1e-4 with --dtype fp32 (the model in float32; TF32
off), 2e-2 and 2e-2 with --dtype bf16 (the model in bfloat16). Prints the largest
absolute and relative differences, the argmax agreement, and PASS or FAIL; exits 0 on
PASS, 1 on FAIL, 2 when the inputs cannot be read.
"""
import argparse
import json
import os
import sys

import torch
from transformers import (AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForQuestionAnswering,
                          AutoModelForSequenceClassification)

TOLERANCE = {"fp32": (1e-4, 1e-4), "bf16": (2e-2, 2e-2)}


def read_rows(path):
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            for key in ("input_ids", "logits"):
                if key not in row:
                    sys.exit(f"{path}:{n}: no '{key}'")
            rows.append(row)
    if not rows:
        sys.exit(f"{path}: no examples")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder")
    ap.add_argument("logits")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=sorted(TOLERANCE), default="fp32")
    ap.add_argument("--atol", type=float)
    ap.add_argument("--rtol", type=float)
    args = ap.parse_args()
    atol, rtol = TOLERANCE[args.dtype]
    atol = args.atol if args.atol is not None else atol
    rtol = args.rtol if args.rtol is not None else rtol

    # Plain fp32 products on the GPU, as tunegraph's fp32 executors compute them.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    with open(os.path.join(args.folder, "config.json")) as f:
        config = json.load(f)
    arch = (config.get("architectures") or ["?"])[0]
    mlm = arch.endswith("ForMaskedLM")
    lm = arch.endswith("LMHeadModel") or arch.endswith("ForCausalLM") or mlm
    qa = arch.endswith("ForQuestionAnswering")
    auto = (AutoModelForMaskedLM if mlm else AutoModelForCausalLM if lm else AutoModelForQuestionAnswering if qa
            else AutoModelForSequenceClassification)
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    model, info = auto.from_pretrained(args.folder, dtype=dtype, local_files_only=True, output_loading_info=True)
    model.to(args.device).eval()
    problems = {k: sorted(map(str, v)) for k, v in info.items() if k != "error_msgs" and v}
    print(f"{args.folder}: {type(model).__name__} ({arch} in config.json), {args.dtype} on {args.device}; "
          f"loading info: {problems or 'every tensor matched'}")

    rows = read_rows(args.logits)
    max_abs = max_rel = 0.0
    worst = None
    bad = agree = compared = 0
    vocab = config.get("vocab_size")
    with torch.no_grad():
        for row in rows:
            ids = torch.tensor([row["input_ids"]], device=args.device)
            kwargs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
            if "token_type_ids" in row:
                kwargs["token_type_ids"] = torch.tensor([row["token_type_ids"]], device=args.device)
            out = model(**kwargs)
            hf = (torch.stack([out.start_logits, out.end_logits], dim=-1) if qa else out.logits)[0].float()
            ref = torch.tensor(row["logits"], dtype=torch.float32, device=args.device)
            if lm:
                hf = hf[:, :vocab]
            if hf.shape != ref.shape:
                print(f"example {row.get('index')}: HF gives logits of shape {tuple(hf.shape)}, tunegraph "
                      f"{tuple(ref.shape)}")
                bad += 1
                continue
            diff = (hf - ref).abs()
            rel = diff / ref.abs().clamp_min(1e-12)
            over = diff > atol + rtol * ref.abs()
            bad += int(over.any())
            compared += 1
            agree += int(torch.equal(hf.argmax(-1), ref.argmax(-1)))
            if diff.max().item() > max_abs:
                max_abs = diff.max().item()
                k = int(diff.argmax())
                worst = (row.get("index"), k, hf.flatten()[k].item(), ref.flatten()[k].item())
            max_rel = max(max_rel, rel.max().item())

    print(f"{len(rows)} examples: max abs diff {max_abs:.3g}, max rel diff {max_rel:.3g} "
          f"(tolerance {atol:g} + {rtol:g} x |tunegraph|); argmax agrees on {agree} of {compared}")
    if worst:
        print(f"largest difference: example {worst[0]}, element {worst[1]}: HF {worst[2]:.9g}, tunegraph "
              f"{worst[3]:.9g}")
    ok = bad == 0 and not problems
    if problems:
        print("the export did not load whole: " + "; ".join(f"{k}: {v}" for k, v in problems.items()))
    if bad:
        print(f"{bad} examples past the tolerance")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
