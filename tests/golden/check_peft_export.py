#!/usr/bin/env python3
"""Loads a LoRA folder written by `tunegraph export` (or `run --save-dir`) with Hugging Face
PEFT over its base folder, and checks that it computes what tunegraph computes.

    python3 tests/golden/check_peft_export.py BASE ADAPTED [--logits LOGITS.jsonl]
        [--eval-data EVAL.jsonl --eval-loss LOSS] [--seq N] [--examples N]
        [--device cuda|cpu] [--atol A] [--rtol R]

BASE is the Hugging Face folder the LoRA job loaded; ADAPTED the folder the LoRA run
exported: config.json and model.safetensors with every adapter merged in (a plain model),
and the subfolder adapter/ with PEFT's adapter_config.json and adapter_model.safetensors
(--adapter names another folder). The model class follows ADAPTED's
config.json (AutoModelForCausalLM for an LM head, AutoModelForSequenceClassification,
AutoModelForMaskedLM, AutoModelForQuestionAnswering), so any family tunegraph gives LoRA
can be checked; BASE's weights are loaded with ADAPTED's config (a classification head
that BASE lacks starts new, and the adapter's modules_to_save replaces it).

Checks, each printed with its largest differences, then PASS or FAIL:
  load     PeftModel.from_pretrained(base, ADAPTED) loads the adapter whole: PEFT's own
           state dict of the adapter (get_peft_model_state_dict) has exactly the file's
           tensor names, each equal to the file's; the base folder and the merged folder
           load with no missing, unexpected or mismatched tensor (beyond the head that
           modules_to_save brings);
  (a)      the logits of base + adapter equal those of the merged folder loaded as a plain
           model: |peft - merged| <= atol + rtol * |merged| element by element (1e-4, 1e-4);
  (b)      with --logits (`tunegraph predict` of the LoRA plan, its rows' input_ids as the
           plan saw them), base + adapter's logits equal tunegraph's, within the same
           tolerance; with --eval-data (`tunegraph data dump` of the eval split, JSON Lines
           with input_ids and, for instruction sets, labels; a classification set's label)
           and --eval-loss (the run's eval_loss), the eval loss that base + adapter give
           on that set, computed as tunegraph does (an LM's token-weighted mean over the
           shifted next-token labels of each example cut to --seq tokens; classification:
           the mean over examples), is within 1e-4 of it, relatively;
  (c)      merge_and_unload()'s weights equal the merged model.safetensors tensor by tensor,
           within 1e-6 of each tensor's largest value (tunegraph merges in double, PEFT in
           float32), and every tensor of the merged model is there.
Inputs for (a) are the --logits rows, else the first --examples of --eval-data, else
seeded random ids. Exits 0 on PASS, 1 on FAIL.
"""
import argparse
import json
import os
import random
import sys
import warnings

import torch
from peft import PeftModel, get_peft_model_state_dict
from safetensors.torch import load_file
from transformers import (AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForQuestionAnswering,
                          AutoModelForSequenceClassification)


def auto_class(config):
    arch = (config.get("architectures") or ["?"])[0]
    if arch.endswith("ForMaskedLM"):
        return AutoModelForMaskedLM, "mlm"
    if arch.endswith("LMHeadModel") or arch.endswith("ForCausalLM"):
        return AutoModelForCausalLM, "lm"
    if arch.endswith("ForQuestionAnswering"):
        return AutoModelForQuestionAnswering, "qa"
    return AutoModelForSequenceClassification, "classify"


def read_jsonl(path, limit=None):
    rows = []
    with open(path) as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
                if limit and len(rows) == limit:
                    break
    if not rows:
        sys.exit(f"{path}: no rows")
    return rows


def logits_of(model, ids, task, device):
    ids = torch.tensor([ids], device=device)
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids))
    if task == "qa":
        return torch.stack([out.start_logits, out.end_logits], dim=-1)[0].float()
    return out.logits[0].float()


def compare(a, ref, atol, rtol):
    """(max abs diff, max diff relative to the largest |ref|, elements over the tolerance)."""
    diff = (a - ref).abs()
    return diff.max().item(), (diff.max() / ref.abs().max().clamp_min(1e-30)).item(), int(
        (diff > atol + rtol * ref.abs()).sum())


def eval_loss(model, rows, task, seq, device, batch=8):
    """tunegraph's eval loss over rows: the sum of the counted labels' losses over their count."""
    total, counted = 0.0, 0
    for start in range(0, len(rows), batch):
        chunk = rows[start:start + batch]
        for row in chunk:
            ids = row["input_ids"][:seq]
            logits = logits_of(model, ids, task, device).double()
            if task in ("lm",):
                if "labels" in row:  # an instruction set: the response tokens alone
                    labels = row["labels"][:seq][1:]
                else:
                    labels = ids[1:]
                labels = torch.tensor(labels, device=device)
                keep = labels != -100
                if keep.any():
                    ce = torch.nn.functional.cross_entropy(logits[:-1][keep], labels[keep], reduction="sum")
                    total += ce.item()
                    counted += int(keep.sum())
            elif task == "classify":
                label = torch.tensor([row["label"]], device=device)
                total += torch.nn.functional.cross_entropy(logits[None], label, reduction="sum").item()
                counted += 1
            else:
                sys.exit(f"--eval-loss: task {task} is not checked here")
    return total / counted, counted


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base")
    ap.add_argument("adapted")
    ap.add_argument("--adapter", help="the PEFT adapter folder (default ADAPTED/adapter)")
    ap.add_argument("--logits")
    ap.add_argument("--eval-data")
    ap.add_argument("--eval-loss", type=float)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--examples", type=int, default=4)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--atol", type=float, default=1e-4)
    ap.add_argument("--rtol", type=float, default=1e-4)
    args = ap.parse_args()
    if (args.eval_loss is None) != (args.eval_data is None):
        ap.error("--eval-data and --eval-loss go together")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    failures = []

    def check(ok, msg):
        print(("  ok   " if ok else "  FAIL ") + msg)
        if not ok:
            failures.append(msg)

    with open(os.path.join(args.adapted, "config.json")) as f:
        config_json = json.load(f)
    adapter_dir = args.adapter or os.path.join(args.adapted, "adapter")
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        adapter_config = json.load(f)
    auto, task = auto_class(config_json)
    config = AutoConfig.from_pretrained(args.adapted, local_files_only=True)
    print(f"{args.adapted}: {config_json.get('architectures')} ({auto.__name__}); {adapter_dir}: r {adapter_config.get('r')}, "
          f"lora_alpha {adapter_config.get('lora_alpha')}, target_modules {adapter_config.get('target_modules')}, "
          f"modules_to_save {adapter_config.get('modules_to_save')}, fan_in_fan_out "
          f"{adapter_config.get('fan_in_fan_out')}; base {args.base}; float32 on {args.device}")

    # load: the base, the adapter over it, and the merged folder.
    base, info = auto.from_pretrained(args.base, config=config, dtype=torch.float32, local_files_only=True,
                                      output_loading_info=True)
    head = tuple(m + "." for m in adapter_config.get("modules_to_save") or [])
    base_problems = {k: sorted(n for n in v if not str(n).startswith(head)) for k, v in info.items()
                     if k != "error_msgs" and v}
    base_problems = {k: v for k, v in base_problems.items() if v}
    check(not base_problems, f"load: base {args.base}: {base_problems or 'every tensor matched'}"
          + (f" (the new head {sorted(set(info.get('missing_keys', [])))} comes from modules_to_save)"
             if info.get("missing_keys") and not base_problems else ""))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = PeftModel.from_pretrained(base, adapter_dir, is_trainable=False)
    missing = [str(w.message) for w in caught if "missing adapter keys" in str(w.message)]
    check(not missing, f"load: PeftModel.from_pretrained: {missing[0] if missing else 'no missing adapter keys'}")
    model.to(args.device).eval()
    saved = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    state = get_peft_model_state_dict(model)
    names_ok = set(saved) == set(state)
    unequal = [k for k in saved if k in state and not torch.equal(saved[k].to(state[k].device), state[k])]
    check(names_ok and not unequal,
          f"load: the adapter as PEFT holds it: {len(state)} tensors, {len(saved)} in the file"
          + ("" if names_ok else f"; only in the file: {sorted(set(saved) - set(state))[:4]}, only in PEFT: "
             f"{sorted(set(state) - set(saved))[:4]}") + (f"; not equal: {unequal[:4]}" if unequal else
                                                            ", each equal to the file's"))
    # A folder with adapter_config.json beside its weights is, to transformers with peft
    # installed, a base model plus an adapter to apply: the merged weights would get the
    # adapters twice.
    check(not os.path.exists(os.path.join(args.adapted, "adapter_config.json")),
          f"load: {args.adapted} has no adapter_config.json beside the merged weights")
    merged, info = auto.from_pretrained(args.adapted, dtype=torch.float32, local_files_only=True,
                                        output_loading_info=True)
    merged.to(args.device).eval()
    problems = {k: sorted(map(str, v)) for k, v in info.items() if k != "error_msgs" and v}
    check(not problems, f"load: merged {args.adapted}: {problems or 'every tensor matched'}")

    # Inputs.
    vocab = config_json.get("vocab_size") or config_json.get("n_vocab")
    tg_rows = read_jsonl(args.logits) if args.logits else None
    if tg_rows:
        inputs = [r["input_ids"] for r in tg_rows]
    elif args.eval_data:
        inputs = [r["input_ids"][:args.seq] for r in read_jsonl(args.eval_data, args.examples)]
    else:
        rng = random.Random(20261127)
        inputs = [[rng.randrange(3, vocab) for _ in range(rng.randrange(8, 24))] for _ in range(args.examples)]

    with torch.no_grad():
        # (a) base + adapter against the merged folder.
        worst = [0.0, 0.0, 0]
        peft_logits = []
        for ids in inputs:
            p = logits_of(model, ids, task, args.device)
            m = logits_of(merged, ids, task, args.device)
            if task in ("lm", "mlm"):
                p, m = p[:, :vocab], m[:, :vocab]
            peft_logits.append(p)
            a, r, n = compare(p, m, args.atol, args.rtol)
            worst = [max(worst[0], a), max(worst[1], r), worst[2] + n]
        check(worst[2] == 0, f"(a) base + adapter vs the merged folder, {len(inputs)} examples: max abs diff "
              f"{worst[0]:.3g}, max diff / max |logit| {worst[1]:.3g}, {worst[2]} elements past "
              f"{args.atol:g} + {args.rtol:g} x |merged|")

        # (b) against tunegraph.
        if tg_rows:
            worst = [0.0, 0.0, 0]
            agree = 0
            for p, row in zip(peft_logits, tg_rows):
                ref = torch.tensor(row["logits"], dtype=torch.float32, device=args.device).reshape(p.shape)
                a, r, n = compare(p, ref, args.atol, args.rtol)
                worst = [max(worst[0], a), max(worst[1], r), worst[2] + n]
                agree += int(torch.equal(p.argmax(-1), ref.argmax(-1)))
            check(worst[2] == 0, f"(b) base + adapter vs tunegraph predict's logits ({args.logits}): max abs diff "
                  f"{worst[0]:.3g}, max diff / max |logit| {worst[1]:.3g}, {worst[2]} elements past the tolerance; "
                  f"argmax agrees on {agree} of {len(tg_rows)}")
        if args.eval_data:
            rows = read_jsonl(args.eval_data)
            loss, counted = eval_loss(model, rows, task, args.seq, args.device)
            rel = abs(loss - args.eval_loss) / abs(args.eval_loss)
            check(rel <= 1e-4, f"(b) eval loss of base + adapter on {len(rows)} examples ({counted} counted) at "
                  f"seq {args.seq}: {loss:.6f}, tunegraph's {args.eval_loss:.6f} (relative difference {rel:.3g})")

        # (c) merge_and_unload against the merged weights (last: it folds the adapters into base).
        unloaded = model.merge_and_unload()
        want = load_file(os.path.join(args.adapted, "model.safetensors"))
        got = unloaded.state_dict()
        worst, worst_name, bad, absent = 0.0, None, [], [k for k in want if k not in got]
        for k, w in want.items():
            if k not in got:
                continue
            g = got[k].detach().float().cpu()
            if g.shape != w.shape:
                bad.append(f"{k} shape {tuple(g.shape)} vs {tuple(w.shape)}")
                continue
            d = ((g - w.float()).abs().max() / w.float().abs().max().clamp_min(1e-30)).item()
            if d > worst:
                worst, worst_name = d, k
            if d > 1e-6:
                bad.append(f"{k} ({d:.3g})")
        extra = [k for k in got if k not in want and not (k == "lm_head.weight" and config.tie_word_embeddings)]
        check(not bad and not absent and not extra,
              f"(c) merge_and_unload vs {args.adapted}/model.safetensors: {len(want)} tensors, largest difference "
              f"{worst:.3g} of the tensor's largest value ({worst_name})"
              + (f"; over 1e-6: {bad[:4]}" if bad else "") + (f"; not in PEFT's model: {absent[:4]}" if absent else "")
              + (f"; not in the file: {extra[:4]}" if extra else ""))

    print("FAIL" if failures else "PASS")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
