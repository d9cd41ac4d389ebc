"""kiln train --model NAME|FILE.py: train a zoo model or a user model on the host.

Writes, with --out DIR: DIR/checkpoint.npz (every --checkpoint-every steps and at each epoch's
end), DIR/metrics.jsonl (one JSON object per epoch), DIR/model.json + model.npz (the trained
eval-mode graph, for `kiln quantize` / `kiln compile`) and DIR/report.json. --resume continues
from DIR/checkpoint.npz and ends bit-identical to an uninterrupted run.
"""
from __future__ import annotations

import dataclasses
import json
import os

from kiln.frontend.errors import KilnError

OPTIONS = [  # (flag, TrainConfig field, type, help)
    ("--epochs", "epochs", int, "epochs to train"),
    ("--lr", "lr", float, "base learning rate"),
    ("--batch-size", "batch_size", int, "(micro-)batch size"),
    ("--optimizer", "optimizer", str, "sgd | adam | adamw"),
    ("--momentum", "momentum", float, "SGD momentum"),
    ("--weight-decay", "weight_decay", float, "weight decay (L2 for sgd/adam, decoupled for adamw)"),
    ("--schedule", "schedule", str, "constant | step | cosine"),
    ("--warmup", "warmup_steps", int, "linear warm-up steps"),
    ("--step-size", "step_size", int, "period of the 'step' schedule, in steps"),
    ("--gamma", "gamma", float, "decay factor of the 'step' schedule"),
    ("--label-smoothing", "label_smoothing", float, "label smoothing for cross-entropy"),
    ("--grad-clip", "grad_clip", float, "clip gradients to this global norm"),
    ("--accum", "accum_steps", int, "accumulate gradients over this many micro-batches per step"),
    ("--augment", "augment", str, "augmentations, e.g. 'shift:1,noise:0.05' ('none' for none)"),
    ("--seed", "seed", int, "seed of the data order, augmentation, dropout and initial weights"),
    ("--checkpoint-every", "checkpoint_every", int, "also checkpoint every N optimiser steps"),
    ("--max-steps", "max_steps", int, "stop after N optimiser steps"),
    ("--threads", "threads", int, "BLAS threads (default: NumPy's)"),
    ("--backend", "backend", str, "numpy (reference executor, default) | tvm (step compiled with TVM for the host CPU) | cuda"),
]


def add_arguments(p):
    p.add_argument("--model", required=True, help="zoo model (ds-cnn, resnet8, mobilenet-v1-0.25, fc-autoencoder, "
                   "digits-cnn) or a .py file defining model()")
    p.add_argument("--data", default=None, help="digits | synthetic | FILE.npz (default: the model's dataset)")
    p.add_argument("--loss", default=None, help="cross_entropy | nll | mse | mse_reconstruction | bce_with_logits")
    for flag, field, typ, help_ in OPTIONS:
        p.add_argument(flag, dest=field, type=typ, default=None, help=help_)
    p.add_argument("--nesterov", action="store_true", default=None, help="Nesterov momentum (SGD)")
    p.add_argument("--out", default=None, help="output folder: checkpoint, metrics log, trained graph")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--device", default=None, choices=["cpu", "cuda"],
                   help="cuda: run the training step as a TVM-generated CUDA package on the GPU (same as --backend cuda)")


def _dataset(spec, entry, sample_shape):
    from kiln.training import data
    if spec == "digits":
        return data.digits()
    if spec == "synthetic":
        if sample_shape is None:
            raise KilnError("synthetic data needs the model's input shape (set INPUT_SHAPE in the model file)")
        from kiln.training.losses import get_loss
        kind = get_loss(entry.loss)[1]
        return data.synthetic(sample_shape, entry.num_classes or 10, target="input" if kind == "input" else "labels")
    if spec.endswith(".npz"):
        return data.load_npz(spec)
    raise KilnError(f"unknown dataset {spec!r}: expected digits, synthetic or a path to an .npz")


def train(args):
    from kiln.frontend.module import manual_seed
    from kiln.training import fit, zoo
    from kiln.training.demo import DIGITS_RECIPE
    from kiln.training.loop import TrainConfig

    overrides = {f: getattr(args, f) for _, f, _, _ in OPTIONS if getattr(args, f) is not None}
    if args.nesterov:
        overrides["nesterov"] = True
    seed = overrides.get("seed", 0)
    manual_seed(seed)
    if args.model.endswith(".py") or os.path.sep in args.model:
        entry, name = zoo.load_user_model(args.model), os.path.splitext(os.path.basename(args.model))[0]
    else:
        entry, name = zoo.get(args.model), args.model
    base = DIGITS_RECIPE if name == "digits-cnn" else TrainConfig(epochs=10, batch_size=64)
    if overrides.get("augment") == "none":
        overrides["augment"] = ""
    loss = args.loss or entry.loss
    spec = args.data or entry.dataset
    sample = tuple(entry.input_shape[1:]) if entry.input_shape else None
    train_ds, test_ds = _dataset(spec, entry._replace(loss=loss), sample)
    if args.resume and not args.out:
        raise KilnError("--resume needs --out DIR (the folder holding checkpoint.npz)")
    r = fit(entry.module, train_ds, test_ds, input_shape=entry.input_shape, config=base, out=args.out,
            resume=args.resume, quiet=args.quiet, model_name=name, loss=loss, **overrides)
    return name, spec, r


def run(args):
    if args.device == "cuda":
        args.backend = "cuda"
    name, spec, r = train(args)
    m = r.metrics
    report = {"model": name, "dataset": spec, "epochs": len(r.history), "steps": r.steps,
              "seconds": round(r.seconds, 3), "files": r.files}
    for k in ("train_loss", "train_acc", "test_loss", "test_acc", "grad_norm", "lr"):
        if k in m:
            report[k] = m[k]
    report["config"] = dataclasses.asdict(r.config)
    lines = [f"kiln train {name} on {spec}: {r.steps} steps in {r.seconds:.1f} s",
             f"{'epoch':>5} {'step':>6} {'lr':>9} {'train loss':>10} {'train acc':>9} {'test loss':>9} "
             f"{'test acc':>8} {'|grad|':>8}"]
    fmt = lambda v, w, p: f"{v:>{w}.{p}f}" if isinstance(v, (int, float)) else f"{'-':>{w}}"
    for h in r.history:
        lines.append(f"{h['epoch']:>5} {h['step']:>6} {h['lr']:>9.2e} {fmt(h.get('train_loss'), 10, 4)} "
                     f"{fmt(h.get('train_acc'), 9, 4)} {fmt(h.get('test_loss'), 9, 4)} {fmt(h.get('test_acc'), 8, 4)} "
                     f"{fmt(h.get('grad_norm'), 8, 3)}")
    for k, v in r.files.items():
        lines.append(f"{k}: {v}")
    report["text"] = "\n".join(lines)
    if args.out:
        path = os.path.join(args.out, "report.json")
        with open(path, "w") as f:
            json.dump({k: v for k, v in report.items() if k != "text"}, f, indent=1, default=str)
        report["files"]["report"] = path
    return report
