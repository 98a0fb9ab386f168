#!/usr/bin/env python3
"""The Hugging Face fine-tune of examples/bbc-news/bbc-news.job on the same split.

Reads the split as `tunegraph data dump` writes it (one {"input_ids": [...], "label": N}
object a line, optional "token_type_ids"), so both trainers see the same token ids in
the same order, and trains as the job says:

  all-MiniLM-L6-v2 (a BertModel checkpoint) + a new 5-way classifier
  (AutoModelForSequenceClassification: pooled [CLS] -> dropout -> linear), batch 32,
  records padded to 256 tokens with the pad id 0 and an attention mask, AdamW lr 1e-4
  (betas 0.9/0.999, eps 1e-8) with weight decay 0.01 on all but biases and LayerNorm
  weights (as the HF Trainer groups them), 17 warmup steps then linear decay to 0
  (get_linear_schedule_with_warmup), gradients clipped to norm 1.0, 3 epochs shuffled
  each epoch by one torch.Generator seeded 42, the last short batch kept (drop_last
  False), bf16 autocast on CUDA and fp32 on the CPU, dropout as the config says.

Prints the eval accuracy with the new head before training and after each epoch, and
the training time; --out writes the same as JSON. Needs torch and transformers only.

  python3 examples/bbc-news/hf_reference.py --train train.jsonl --eval eval.jsonl \\
      [--model build/assets/all-minilm-l6-v2] [--device cuda|cpu] [--epochs 3] [--out hf.json]
"""
import argparse
import contextlib
import json
import math
import sys
import time

BATCH = 32
SEQ = 256
LR = 1e-4
WEIGHT_DECAY = 0.01
WARMUP_STEPS = 17
GRAD_CLIP = 1.0
SEED = 42
NUM_LABELS = 5
PAD_ID = 0


def load_dump(path):
    """The records of a `tunegraph data dump` file, in order: a list of
    (input_ids, token_type_ids or None, label) with plain int lists. Blank lines are
    skipped, as the dataset loader skips them; a line without input_ids or label is an
    error naming the file and line."""
    records = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            obj = json.loads(line)
            ids = obj.get("input_ids")
            label = obj.get("label")
            if not isinstance(ids, list) or not ids:
                raise ValueError(f"{path}:{line_no}: no input_ids")
            if not isinstance(label, int):
                raise ValueError(f"{path}:{line_no}: no integer label (dump a classify set)")
            types = obj.get("token_type_ids")
            if types is not None and len(types) != len(ids):
                raise ValueError(f"{path}:{line_no}: token_type_ids has {len(types)} entries, input_ids {len(ids)}")
            records.append((ids, types, label))
    if not records:
        raise ValueError(f"{path}: no records")
    return records


def pad_batch(records, seq=SEQ, pad_id=PAD_ID):
    """Rows cut to seq and padded on the right to exactly seq (the plan's fixed shape):
    (input_ids, token_type_ids, attention_mask, labels) as lists of lists."""
    ids, types, mask, labels = [], [], [], []
    for r_ids, r_types, label in records:
        n = min(len(r_ids), seq)
        ids.append(r_ids[:n] + [pad_id] * (seq - n))
        types.append((r_types[:n] if r_types is not None else [0] * n) + [0] * (seq - n))
        mask.append([1] * n + [0] * (seq - n))
        labels.append(label)
    return ids, types, mask, labels


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="build/assets/all-minilm-l6-v2", help="Hugging Face model folder")
    p.add_argument("--train", required=True, help="train split, from `tunegraph data dump`")
    p.add_argument("--eval", required=True, help="eval split, from `tunegraph data dump`")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--out", default=None, help="write the summary as JSON here")
    p.add_argument("--limit", type=int, default=0,
                   help="use only the first N train and eval records (a quick check; 0: all)")
    a = p.parse_args(argv)

    try:
        import torch
        import transformers
        from transformers import AutoModelForSequenceClassification, get_linear_schedule_with_warmup
    except ImportError as e:
        print(f"hf_reference.py: needs torch and transformers ({e}); pip install torch transformers",
              file=sys.stderr)
        return 1

    train = load_dump(a.train)
    evals = load_dump(a.eval)
    if a.limit > 0:
        train, evals = train[: a.limit], evals[: a.limit]
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    on_cuda = device.type == "cuda"

    def to_tensors(records):
        ids, types, mask, labels = pad_batch(records)
        return (torch.tensor(ids, dtype=torch.long, device=device),
                torch.tensor(types, dtype=torch.long, device=device),
                torch.tensor(mask, dtype=torch.long, device=device),
                torch.tensor(labels, dtype=torch.long, device=device))

    def autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16) if on_cuda else contextlib.nullcontext()

    def sync():
        if on_cuda:
            torch.cuda.synchronize(device)

    torch.manual_seed(SEED)  # the new classifier's initial values, then dropout
    # fp32 weights whatever dtype the checkpoint or the library's default loads; autocast
    # runs the matmuls in bf16 on CUDA.
    model = AutoModelForSequenceClassification.from_pretrained(a.model, num_labels=NUM_LABELS).float().to(device)

    def evaluate():
        model.eval()
        correct, loss_sum = 0, 0.0
        with torch.no_grad():
            for i in range(0, len(evals), BATCH):
                ids, types, mask, labels = to_tensors(evals[i:i + BATCH])
                with autocast():
                    logits = model(input_ids=ids, token_type_ids=types, attention_mask=mask).logits
                logits = logits.float()
                loss_sum += torch.nn.functional.cross_entropy(logits, labels, reduction="sum").item()
                correct += (logits.argmax(-1) == labels).sum().item()
        model.train()
        return correct / len(evals), loss_sum / len(evals)

    # AdamW groups as the HF Trainer makes them: no decay on biases and LayerNorm weights.
    no_decay = set()
    for module_name, module in model.named_modules():
        for name, _ in module.named_parameters(recurse=False):
            full = f"{module_name}.{name}" if module_name else name
            if name == "bias" or isinstance(module, torch.nn.LayerNorm):
                no_decay.add(full)
    params = [(n, q) for n, q in model.named_parameters() if q.requires_grad]
    groups = [{"params": [q for n, q in params if n not in no_decay], "weight_decay": WEIGHT_DECAY},
              {"params": [q for n, q in params if n in no_decay], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.999), eps=1e-8)
    steps_per_epoch = math.ceil(len(train) / BATCH)
    total_steps = steps_per_epoch * a.epochs
    scheduler = get_linear_schedule_with_warmup(optimizer, WARMUP_STEPS, total_steps)
    generator = torch.Generator().manual_seed(SEED)

    print(f"hf: {a.model} on {device}, {len(train)} train and {len(evals)} eval records, "
          f"{a.epochs} epochs of {steps_per_epoch} steps (batch {BATCH} x {SEQ}, "
          f"{'bf16 autocast' if on_cuda else 'fp32'}); torch {torch.__version__}, "
          f"transformers {transformers.__version__}", flush=True)
    before_acc, before_loss = evaluate()
    print(f"hf: before: eval accuracy {before_acc:.4f}, loss {before_loss:.4f}", flush=True)

    epochs = []
    train_s = 0.0
    model.train()
    step = 0
    for epoch in range(a.epochs):
        order = torch.randperm(len(train), generator=generator).tolist()
        sync()
        t0 = time.perf_counter()
        loss_sum = torch.zeros((), device=device)  # summed on the device: no sync a step
        for i in range(0, len(order), BATCH):
            ids, types, mask, labels = to_tensors([train[k] for k in order[i:i + BATCH]])
            with autocast():
                loss = model(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            loss_sum += loss.detach().float()
            step += 1
        sync()
        epoch_s = time.perf_counter() - t0
        train_s += epoch_s
        acc, eval_loss = evaluate()
        row = {"epoch": epoch + 1, "step": step, "train_loss": loss_sum.item() / steps_per_epoch,
               "eval_accuracy": acc, "eval_loss": eval_loss, "seconds": epoch_s}
        epochs.append(row)
        print(f"hf: epoch {epoch + 1}: step {step}, mean train loss {row['train_loss']:.4f}, "
              f"eval accuracy {acc:.4f}, loss {eval_loss:.4f} ({epoch_s:.1f} s)", flush=True)
    print(f"hf: trained {step} steps in {train_s:.1f} s ({1e3 * train_s / max(step, 1):.1f} ms a step, "
          f"without the evals); eval accuracy {before_acc:.4f} -> "
          f"{epochs[-1]['eval_accuracy'] if epochs else before_acc:.4f}", flush=True)

    summary = {"model": a.model, "train": a.train, "eval": a.eval, "device": str(device),
               "device_name": torch.cuda.get_device_name(device) if on_cuda else "cpu",
               "precision": "bf16 autocast" if on_cuda else "fp32",
               "torch": torch.__version__, "transformers": transformers.__version__,
               "train_records": len(train), "eval_records": len(evals), "batch": BATCH, "seq": SEQ,
               "steps": step, "before": {"eval_accuracy": before_acc, "eval_loss": before_loss},
               "epochs": epochs, "train_seconds": train_s,
               "after_accuracy": epochs[-1]["eval_accuracy"] if epochs else before_acc}
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
