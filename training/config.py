"""``TrainConfig``: the options of a training run, and the bounds every option must respect.

The bounds live in one table (``BOUNDS``): ``TrainConfig`` checks them when it is built (so
``fit(epochs=-1)`` fails at once with a :class:`~kiln.frontend.errors.UsageError`) and
``kiln train`` checks each flag against the same table while parsing its arguments.
"""
from __future__ import annotations

import dataclasses
import math
import numbers

from kiln.frontend.errors import UsageError


@dataclasses.dataclass
class TrainConfig:
    epochs: int = 10
    batch_size: int = 32
    lr: float = 1e-3
    optimizer: str = "adam"          # sgd | adam | adamw
    momentum: float = 0.9            # SGD only
    nesterov: bool = False           # SGD only
    weight_decay: float | None = None  # None: the optimiser's default (0; AdamW 0.01)
    schedule: str = "constant"       # constant | step | cosine
    warmup_steps: int = 0
    step_size: int | None = None     # 'step' schedule period in steps (default: a third of the run)
    gamma: float = 0.1
    min_lr: float = 0.0
    loss: str = "cross_entropy"
    label_smoothing: float = 0.0
    grad_clip: float | None = None
    accum_steps: int = 1
    augment: str = ""                # e.g. "shift:1,noise:0.05"
    drop_last: bool = False
    seed: int = 0
    checkpoint_every: int | None = None  # optimiser steps; checkpoints are also written at epoch ends
    max_steps: int | None = None
    eval_batch_size: int = 512
    threads: int | None = None       # BLAS threads during the run (None: leave NumPy's default)
    backend: str = "numpy"           # "numpy" (reference executor) or a step compiler: kiln.step_compiler(
                                     # "host-llvm" | "cuda"); fit() records the compiler's name here
    divergence_factor: float | None = 1e3  # stop when a step's loss exceeds this times its running minimum

    def __post_init__(self):
        problems = [p for p in (check_value(k, getattr(self, k)) for k in BOUNDS) if p]
        if problems:
            raise UsageError("invalid training options: " + "; ".join(problems))


# options that may differ between a run and its resumption
RESUMABLE_CHANGES = ("epochs", "checkpoint_every", "max_steps", "eval_batch_size", "threads", "backend",
                     "divergence_factor")

# field: (type, lowest, lowest itself allowed?, highest or None, highest itself allowed?)
BOUNDS = {
    "epochs": (int, 1, True, None, False),
    "batch_size": (int, 1, True, None, False),
    "accum_steps": (int, 1, True, None, False),
    "eval_batch_size": (int, 1, True, None, False),
    "step_size": (int, 1, True, None, False),
    "checkpoint_every": (int, 1, True, None, False),
    "max_steps": (int, 1, True, None, False),
    "threads": (int, 1, True, None, False),
    "warmup_steps": (int, 0, True, None, False),
    "seed": (int, 0, True, None, False),
    "lr": (float, 0.0, False, None, False),
    "gamma": (float, 0.0, False, None, False),
    "grad_clip": (float, 0.0, False, None, False),
    "momentum": (float, 0.0, True, None, False),
    "weight_decay": (float, 0.0, True, None, False),
    "min_lr": (float, 0.0, True, None, False),
    "label_smoothing": (float, 0.0, True, 1.0, False),
    "divergence_factor": (float, 1.0, False, None, False),
}


def check_value(field, value):
    """None when ``value`` is allowed for ``field``, else a sentence saying what is wrong. ``None``
    values (an option left unset) are always allowed."""
    if value is None or field not in BOUNDS:
        return None
    typ, low, low_ok, high, high_ok = BOUNDS[field]
    if isinstance(value, bool) or not isinstance(value, numbers.Integral if typ is int else numbers.Real):
        return f"{field} must be {'an integer' if typ is int else 'a number'}, got {value!r}"
    if not math.isfinite(value):
        return f"{field} must be finite, got {value}"
    if value < low or (value == low and not low_ok):
        return f"{field} must be {'>=' if low_ok else '>'} {low}, got {value}"
    if high is not None and (value > high or (value == high and not high_ok)):
        return f"{field} must be {'<=' if high_ok else '<'} {high}, got {value}"
    return None
