#!/usr/bin/env python3
"""Golden data for model = mobilenet_v2: what PyTorch + torchvision compute for a tiny random
torchvision.models.mobilenet_v2 (width_mult 0.25, 3 classes, 3 x 64 x 64 images, batch 4):
the images as bytes made the model's input by torchvision's ToTensor and Normalize (mean and
std per channel, ImageNet's), the forward logits and loss in training mode, every parameter gradient, then the weights,
the batch normalisations' running statistics and the eval-mode logits after 3 AdamW steps
on the same batch. tests/test_golden_mobilenet.c checks the tunegraph CPU reference
against them.

The weights and the normalised images are float32 (as written); torch computes on the CPU in float64 from
them, and the results are stored rounded to float32: a batch normalisation over few values
(here 4 images of 2 x 2 positions in the last blocks) amplifies rounding, so that two float32
computations in different orders differ far more than either differs from the exact
function (at 32 x 32, torch's own float32 gradients are 0.5% from float64's; at 64 x 64,
6e-5). torch.manual_seed(0), deterministic algorithms, one thread.

The classifier's dropout is 0 (classifier.0.p = 0; the config says classifier_dropout 0),
so both sides compute the same function; batch normalisation runs in training mode (batch
statistics, running statistics updated with momentum 0.1 and the unbiased variance). The
gradients are taken at the initial weights, after which the running statistics are put
back as they were, so that they are those of exactly three training forwards at the end.
AdamW's eps is 1e-2: with 1e-8 it turns gradients at the noise level into full steps of
either sign, and torch's own float32 and float64 runs end 2.7% apart in the third step's
loss. The biases of the blocks' last batch norms are frozen (FROZEN, the job's freeze).

    python3 tests/golden/make_golden_mobilenet.py tests/golden/data

writes OUTDIR/mobilenet_v2/: config.json (tunegraph's mobilenet_v2 config), model.safetensors
(the model's whole state dict as torchvision has it, num_batches_tracked included),
golden.safetensors and meta.json. It checks what it writes and prints OK at the end.
"""
import fnmatch
import json
import os
import sys

import torch
import torchvision
from safetensors.torch import load_file, save_file

CASE = "mobilenet_v2"
WIDTH, CLASSES, CHANNELS, SIZE, BATCH = 0.25, 3, 3, 64, 4
LR, BETAS, EPS, WEIGHT_DECAY, MAX_GRAD_NORM, STEPS = 1e-3, (0.9, 0.999), 1e-2, 0.01, 1.0, 3
FROZEN = "features.1.conv.2.bias,features.*.conv.3.bias"
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def fail(msg):
    print("FAILED: " + msg)
    sys.exit(1)


F32_NORM_TOL, F32_PARAM_TOL = 2e-3, 1e-5


def three_steps(out, pixel_values, labels, dtype):
    """The gradient norms and final parameters of three AdamW steps in dtype from the saved
    initial state, as the golden run below takes them."""
    model = torchvision.models.mobilenet_v2(width_mult=WIDTH, num_classes=CLASSES)
    model.classifier[0].p = 0.0
    model.load_state_dict(load_file(os.path.join(out, "model.safetensors")), strict=True)
    model = model.to(dtype).train()
    for n, p in model.named_parameters():
        if fnmatch.fnmatch(n, "features.1.conv.2.bias") or fnmatch.fnmatch(n, "features.*.conv.3.bias"):
            p.requires_grad_(False)
    decay = [p for n, p in model.named_parameters() if p.ndim > 1 and p.requires_grad]
    no_decay = [p for n, p in model.named_parameters() if p.ndim <= 1 and p.requires_grad]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS)
    norms = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(pixel_values.to(dtype)), labels).backward()
        norms.append(torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad],
                                                    MAX_GRAD_NORM).item())
        opt.step()
    return norms, torch.cat([p.detach().to(torch.float64).flatten() for p in model.parameters()])


def main():
    if len(sys.argv) != 2:
        fail("usage: make_golden_mobilenet.py OUTDIR")
    out = os.path.join(sys.argv[1], CASE)
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)

    model = torchvision.models.mobilenet_v2(width_mult=WIDTH, num_classes=CLASSES)
    model.classifier[0].p = 0.0
    # Larger batch-norm affine parameters than 1 and 0, so that their gradients and updates
    # are not those of an identity.
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    model.train()
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    save_file(state, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    model = model.to(torch.float64)
    # The bias of each block's last batch norm (the linear bottleneck's) has no effect on the
    # loss: what it adds per channel, the next 1x1 convolution turns into a per-channel
    # constant that the next batch norm takes out again (down the residual stream as well). Its
    # gradient is 0 in exact arithmetic, rounding noise in any float computation, on which
    # AdamW takes full steps of either sign; and those steps move the next normalisations'
    # running means. So both sides freeze these biases (the job's freeze = FROZEN).
    for n, p in model.named_parameters():
        if fnmatch.fnmatch(n, "features.1.conv.2.bias") or fnmatch.fnmatch(n, "features.*.conv.3.bias"):
            p.requires_grad_(False)
    config = {"model_type": "mobilenet_v2", "image_channels": CHANNELS, "image_size": SIZE, "width_mult": WIDTH,
              "classifier_dropout": 0.0, "batch_norm_eps": 1e-05, "batch_norm_momentum": 0.1}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")

    # The images as a shard set stores them (bytes, channel planes), then ToTensor's
    # division and Normalize's subtraction and division, each in float32. Random bytes make
    # most draws ill-conditioned for three steps (ReLU6 kinks in the last blocks' 16-value
    # normalisations: torch's own float32 run ends up to 38% from float64's in the third
    # step's gradient norm), which would test the rounding, not the function; the draw is
    # the first whose float32 run stays within F32_NORM_TOL / F32_PARAM_TOL of float64.
    labels = torch.tensor([0, 2, 1, 2], dtype=torch.int64)
    normalize = torchvision.transforms.Normalize(MEAN, STD)
    for image_seed in range(1, 65):
        gen = torch.Generator().manual_seed(image_seed)
        pixels = torch.randint(0, 256, (BATCH, CHANNELS, SIZE, SIZE), dtype=torch.uint8, generator=gen)
        pixel_values = normalize(pixels.to(torch.float32).div(255))  # float32, widened for the model
        norms64, params64 = three_steps(out, pixel_values, labels, torch.float64)
        norms32, params32 = three_steps(out, pixel_values, labels, torch.float32)
        f32_norm_dev = max(abs(a / b - 1) for a, b in zip(norms32, norms64))
        f32_param_dev = ((params32 - params64).norm() / params64.norm()).item()
        if f32_norm_dev <= F32_NORM_TOL and f32_param_dev <= F32_PARAM_TOL:
            break
    else:
        fail("no image draw of 64 is well conditioned")
    loss_fn = torch.nn.CrossEntropyLoss()
    buffers0 = {k: v.detach().clone() for k, v in model.named_buffers()}

    logits = model(pixel_values.to(torch.float64))
    loss = loss_fn(logits, labels)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    recomputed = torch.nn.functional.cross_entropy(logits.detach(), labels)
    if abs(recomputed.item() - loss.item()) > 1e-12:
        fail("loss %g, recomputed %g" % (loss.item(), recomputed.item()))
    with torch.no_grad():
        for k, v in model.named_buffers():
            v.copy_(buffers0[k])
    model.zero_grad(set_to_none=True)

    # AdamW as tunegraph's plan: decay on the convolution weights and the classifier's
    # weight, none on the batch-norm parameters and biases (no_decay); clip to norm 1.
    decay = [p for n, p in model.named_parameters() if p.ndim > 1 and p.requires_grad]
    no_decay = [p for n, p in model.named_parameters() if p.ndim <= 1 and p.requires_grad]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS)
    loss_steps, grad_norm_steps = [], []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        step_loss = loss_fn(model(pixel_values.to(torch.float64)), labels)
        step_loss.backward()
        norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], MAX_GRAD_NORM)
        opt.step()
        loss_steps.append(step_loss.item())
        grad_norm_steps.append(norm.item())
    if abs(loss_steps[0] - loss.item()) > 1e-12:
        fail("step 1 loss %g differs from the initial loss %g" % (loss_steps[0], loss.item()))
    model.eval()
    with torch.no_grad():
        eval_logits = model(pixel_values.to(torch.float64))

    f32 = torch.float32
    golden = {"pixels": pixels.to(torch.int32).contiguous(), "pixel_values": pixel_values.contiguous(),
              "labels": labels.to(torch.int32),
              "logits": logits.detach().to(f32).contiguous(), "loss": loss.detach().to(f32).reshape(1),
              "loss_steps": torch.tensor(loss_steps, dtype=f32), "lr_steps": torch.tensor([LR] * STEPS, dtype=f32),
              "grad_norm_steps": torch.tensor(grad_norm_steps, dtype=f32), "eval_logits": eval_logits.to(f32).contiguous()}
    for n, g in grads.items():
        golden["grad." + n] = g.to(f32).contiguous()
    for n, p in model.named_parameters():
        golden["step3." + n] = p.detach().to(f32).contiguous()
    for n, b in model.named_buffers():
        if n.endswith("num_batches_tracked"):
            if b.item() != STEPS:
                fail("%s is %d after %d steps" % (n, b.item(), STEPS))
            continue
        golden["step3." + n] = b.detach().to(f32).contiguous()
    save_file(golden, os.path.join(out, "golden.safetensors"))

    names = [n for n, _ in model.named_parameters()]
    meta = {"case": CASE, "task": "classify", "num_labels": CLASSES, "B": BATCH,
            "image_channels": CHANNELS, "image_size": SIZE, "width_mult": WIDTH, "image_mean": list(MEAN),
            "image_std": list(STD),
            "optimizer": {"name": "AdamW", "lr": LR, "betas": list(BETAS), "eps": EPS, "weight_decay": WEIGHT_DECAY},
            "scheduler": {"name": "constant", "num_warmup_steps": 0, "num_training_steps": STEPS},
            "max_grad_norm": MAX_GRAD_NORM, "classifier_dropout": 0.0, "freeze": FROZEN,
            "compute_dtype": "float64", "image_seed": image_seed,
            "torch_float32_deviation": {"grad_norm_steps": f32_norm_dev, "step3_parameters": f32_param_dev}, "versions": {"torch": torch.__version__, "torchvision": torchvision.__version__},
            "parameters": [[n, list(p.shape)] for n, p in model.named_parameters()],
            "no_decay": [n for n, p in model.named_parameters() if p.ndim <= 1 and p.requires_grad],
            "frozen": [n for n, p in model.named_parameters() if not p.requires_grad]}
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")

    # What was written reads back; the state dict reloads strictly, num_batches_tracked too.
    check = torchvision.models.mobilenet_v2(width_mult=WIDTH, num_classes=CLASSES)
    check.load_state_dict(load_file(os.path.join(out, "model.safetensors")), strict=True)
    back = load_file(os.path.join(out, "golden.safetensors"))
    if set(back) != set(golden) or len(names) != 158:
        fail("golden keys or parameter count differ")
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print("%s: loss %.6f, steps %s, grad norms %s, %d parameters, %d bytes" %
          (CASE, loss.item(), ["%.6f" % x for x in loss_steps], ["%.4f" % x for x in grad_norm_steps],
           sum(p.numel() for p in model.parameters()), size))
    if size > 6 << 20:
        fail("the case is larger than 6 MiB")
    print("OK")


if __name__ == "__main__":
    main()
