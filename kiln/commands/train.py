"""kiln train --model NAME|FILE.py: train a zoo model or a user model on the host.

Writes into --out DIR (default: runs/train/MODEL-YYYYmmdd-HHMMSS): DIR/checkpoint.npz (every
--checkpoint-every steps and at each epoch's end), DIR/metrics.jsonl (one JSON object per epoch),
DIR/model.json + model.npz (the trained eval-mode graph, for `kiln quantize` / `kiln compile`)
and DIR/report.json. --resume continues from DIR/checkpoint.npz and ends bit-identical to an
uninterrupted run. A DIR that already holds a run is not overwritten: on a terminal Kiln asks,
otherwise it refuses unless --force (replace it) or --resume (continue it) is given. A run whose
loss diverges stops with exit code 1, keeping its last good checkpoint.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import sys

from kiln.frontend.errors import KilnError, UsageError
from kiln.frontend.files import atomic_write
from kiln.frontend.module import manual_seed
from kiln.training import data, fit, zoo
from kiln.training.config import TrainConfig, check_value
from kiln.training.demo import DIGITS_RECIPE
from kiln.training.loop import existing_run
from kiln.training.losses import get_loss
from kiln.training_backends import DEPRECATED, step_compiler

# the recipe of every model but digits-cnn (which uses DIGITS_RECIPE)
ZOO_RECIPE = TrainConfig(epochs=10, batch_size=64)
RUNS_DIR = os.path.join("runs", "train")

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
    ("--threads", "threads", int, "BLAS threads"),
    ("--backend", "backend", str, "numpy (reference executor) | host-llvm (step compiled with TVM for the host CPU; "
     "'tvm' is its old name) | cuda (step as a CUDA package on the GPU)"),
    ("--divergence-factor", "divergence_factor", float,
     "stop (exit 1) when a step's loss exceeds this many times its running minimum; NaN/Inf always stop"),
]
# what an unset (None) option means, for --help
UNSET = {"weight_decay": "the optimiser's own: 0, adamw 0.01", "step_size": "a third of the run",
         "grad_clip": "off", "checkpoint_every": "epoch ends only", "max_steps": "no limit",
         "threads": "NumPy's", "augment": "none", "divergence_factor": "off"}


def _default_help(field):
    def show(v):
        return UNSET.get(field, "none") if v in (None, "") else v
    base, digits = show(getattr(ZOO_RECIPE, field)), show(getattr(DIGITS_RECIPE, field))
    return f"(default: {base}" + (f"; digits-cnn: {digits})" if digits != base else ")")


def add_arguments(p):
    p.add_argument("--model", required=True, help="zoo model (ds-cnn, resnet8, mobilenet-v1-0.25, fc-autoencoder, "
                   "digits-cnn), a .py file defining model(), or a float model file to fine-tune: a Kiln graph "
                   ".json (e.g. from `kiln import`), an .onnx or a .pt2 (needs --data)")
    p.add_argument("--data", default=None, help="digits | synthetic | FILE.npz (default: the model's own dataset: "
                   "digits for digits-cnn, synthetic data for the MLPerf Tiny models)")
    p.add_argument("--loss", default=None, help="cross_entropy | nll | mse | mse_reconstruction | bce_with_logits "
                   "(default: the model's own loss)")
    for flag, field, typ, help_ in OPTIONS:
        p.add_argument(flag, dest=field, type=typ, default=None, help=f"{help_} {_default_help(field)}")
    p.add_argument("--nesterov", action="store_true", default=None, help="Nesterov momentum (SGD) (default: off)")
    p.add_argument("--out", default=None, help="output folder: checkpoint, metrics log, trained graph "
                   f"(default: {RUNS_DIR}/MODEL-YYYYmmdd-HHMMSS, a new folder)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint (default: off)")
    p.add_argument("--force", action="store_true", help="replace a run already in --out (default: off: ask on a "
                   "terminal, refuse otherwise)")
    p.add_argument("--quiet", action="store_true", help="no progress bars (default: bars only when stderr is a "
                   "terminal)")
    p.add_argument("--device", default=None, choices=["cpu", "cuda"],
                   help="cuda: run the training step as a TVM-generated CUDA package on the GPU (same as "
                        "--backend cuda) (default: cpu)")


def _dataset(spec, entry, sample_shape):
    if spec == "digits":
        return data.digits()
    if spec == "synthetic":
        if sample_shape is None:
            raise KilnError("synthetic data needs the model's input shape (set INPUT_SHAPE in the model file)")
        kind = get_loss(entry.loss)[1]
        return data.synthetic(sample_shape, entry.num_classes or 10, target="input" if kind == "input" else "labels")
    if spec.endswith(".npz"):
        return data.load_npz(spec)
    raise UsageError(f"unknown dataset {spec!r}: expected digits, synthetic or a path to an .npz")


def _overrides(args):
    overrides = {f: getattr(args, f) for _, f, _, _ in OPTIONS if getattr(args, f) is not None}
    problems = [check_value(f, v) for f, v in overrides.items()]
    flags = {f: flag for flag, f, _, _ in OPTIONS}
    problems = [flags[f] + p[len(f):] for f, p in zip(overrides, problems) if p]
    if problems:
        raise UsageError("; ".join(problems))
    if args.nesterov:
        overrides["nesterov"] = True
    if overrides.get("augment") == "none":
        overrides["augment"] = ""
    if "backend" in overrides:
        overrides["backend"] = _backend(overrides["backend"])
    return overrides


def _backend(name):
    """--backend NAME resolved through the registry of backends (kiln.step_compiler); an old name
    still works, with a note on stderr."""
    if name in DEPRECATED:
        print(f"kiln train: --backend {name} is deprecated, use --backend {DEPRECATED[name]} (the same backend)",
              file=sys.stderr)
        name = DEPRECATED[name]
    return step_compiler(name)


def default_out(name, now=None):
    """A new folder for a run without --out: runs/train/NAME-YYYYmmdd-HHMMSS (-2, -3... if taken)."""
    stamp = (now or datetime.datetime.now()).strftime("%Y%m%d-%H%M%S")
    base = os.path.join(RUNS_DIR, f"{os.path.basename(name)}-{stamp}")
    out, k = base, 2
    while os.path.exists(out):
        out, k = f"{base}-{k}", k + 1
    return out


def _may_replace(out, force, resume, interactive):
    """Whether to replace a run already in ``out``: --force, or yes on a terminal; else UsageError."""
    old = existing_run(out)
    if resume or not old or force:
        return force
    if interactive:
        print(f"{out} already holds a training run ({', '.join(old)}). Replace it? [y/N] ", end="", file=sys.stderr,
              flush=True)
        try:
            answer = sys.stdin.readline().strip().lower()
        except (EOFError, OSError):
            answer = ""
        if answer in ("y", "yes"):
            return True
    raise UsageError(f"{out} already holds a training run ({', '.join(old)}): continue it with --resume, replace "
                     f"it with --force, or choose another --out")


def train(args):
    overrides = _overrides(args)
    if args.resume and args.force:
        raise UsageError("--resume continues the run in --out, --force replaces it: give one of them")
    if args.resume and not args.out:
        raise UsageError("--resume needs --out DIR (the folder holding checkpoint.npz)")
    seed = overrides.get("seed", 0)
    manual_seed(seed)
    entry, name = zoo.resolve(args.model)
    if zoo.is_model_file(args.model) and not args.data:
        raise UsageError(f"{args.model} has no dataset of its own: give --data FILE.npz (x_train, y_train, "
                         f"x_test, y_test) or --data synthetic")
    base = DIGITS_RECIPE if name == "digits-cnn" else ZOO_RECIPE
    out = args.out or default_out(name)
    force = _may_replace(out, args.force, args.resume, sys.stdin.isatty() and not args.json)
    loss = args.loss or entry.loss
    spec = args.data or entry.dataset
    sample = tuple(entry.input_shape[1:]) if entry.input_shape else None
    train_ds, test_ds = _dataset(spec, entry._replace(loss=loss), sample)
    r = fit(entry.module, train_ds, test_ds, input_shape=entry.input_shape, config=base, out=out,
            resume=args.resume, force=force, quiet=args.quiet, model_name=name, loss=loss, **overrides)
    return name, spec, out, r


def run(args):
    if args.device == "cuda":
        args.backend = "cuda"
    name, spec, out, r = train(args)
    m = r.metrics
    report = {"model": name, "dataset": spec, "out": out, "epochs": len(r.history), "steps": r.steps,
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
    path = os.path.join(out, "report.json")
    atomic_write(path, json.dumps({k: v for k, v in report.items() if k != "text"}, indent=1, default=str).encode())
    report["files"]["report"] = path
    for k, v in r.files.items():
        lines.append(f"{k}: {v}")
    lines.append(f"trained model saved in {out} (next: kiln quantize {r.files['graph']})")
    report["text"] = "\n".join(lines)
    return report
