#!/usr/bin/env python3
"""Records the learning rates of Hugging Face's schedules with warm-up, for SCHEDULE's
forms (kernels/lr_schedule.h): linear, cosine and constant.

    python3 tests/golden/lr_schedules.py OUT.json

For each (schedule, peak lr, warm-up steps, total steps) case it builds
transformers.get_{linear,cosine,constant}_schedule_with_warmup over a one-parameter
torch.optim.AdamW and reads the rate after k scheduler steps, k = 0 .. total + 2 (past
the end too): the rate the (k+1)-th update uses, which SCHEDULE computes from k completed
updates. Writes {"transformers": version, "cases": [{"schedule", "lr", "warmup", "total",
"rates": [...]}, ...]} with the rates as Python floats (doubles). Needs torch and
transformers; runs on the CPU in a second.
"""
import json
import sys

import torch
import transformers

SCHEDULES = {
    "linear": transformers.get_linear_schedule_with_warmup,
    "cosine": transformers.get_cosine_schedule_with_warmup,
    "constant": transformers.get_constant_schedule_with_warmup,
}
# (peak lr, warm-up steps, total steps): no warm-up, a short and a long one, a warm-up as
# long as the run, odd totals, and one step.
SHAPES = [(1e-3, 0, 10), (5e-5, 3, 17), (2e-4, 10, 100), (3e-4, 7, 7), (1e-3, 1, 1), (0.5, 4, 13), (1e-4, 0, 1000)]


def rates(name, lr, warmup, total):
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([param], lr=lr)
    if name == "constant":
        sched = SCHEDULES[name](opt, num_warmup_steps=warmup)
    else:
        sched = SCHEDULES[name](opt, num_warmup_steps=warmup, num_training_steps=total)
    out = []
    for _ in range(total + 3):
        out.append(float(opt.param_groups[0]["lr"]))
        opt.step()
        sched.step()
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: lr_schedules.py OUT.json")
    cases = [{"schedule": name, "lr": lr, "warmup": warmup, "total": total, "rates": rates(name, lr, warmup, total)}
             for name in SCHEDULES for (lr, warmup, total) in SHAPES]
    with open(sys.argv[1], "w") as f:
        json.dump({"transformers": transformers.__version__, "torch": torch.__version__, "cases": cases}, f, indent=1)
    print(f"{len(cases)} cases, {sum(len(c['rates']) for c in cases)} rates -> {sys.argv[1]}")


if __name__ == "__main__":
    main()
