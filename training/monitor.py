"""Monitoring: gradient global norm and clipping, non-finite detection with a check-mode re-run
that names the node, the JSON-lines metrics log and the tqdm progress bars."""
from __future__ import annotations

import json
import math
import os
import sys

import numpy as np

from kiln.frontend.errors import NumericsError

from .checkpoint import atomic_write


class TrainingDiverged(NumericsError):
    """The loss or a gradient became NaN/Inf: names the step and, from a check-mode re-run of the
    step graph, the first node that produced the bad value and its op."""


def global_norm(grads: dict) -> float:
    """sqrt of the sum of squares of every gradient (accumulated in float64, as
    torch.nn.utils.clip_grad_norm_ reports it)."""
    s = 0.0
    for g in grads.values():
        g = np.asarray(g, np.float64).ravel()
        s += float(np.dot(g, g))
    return math.sqrt(s)


def clip_by_global_norm(grads: dict, max_norm: float, norm: float):
    """Scale all gradients by max_norm / (norm + 1e-6) when that is below 1 (torch's rule)."""
    coef = max_norm / (norm + 1e-6)
    if coef >= 1.0:
        return grads
    return {k: (g * np.asarray(coef, g.dtype)) for k, g in grads.items()}


def diagnose(step_graph, params, buffers, x, y, key, where):
    """Re-run a step in check mode and raise TrainingDiverged naming the first bad node."""
    try:
        step_graph(params, buffers, x, y, key, check=True)
    except NumericsError as e:
        raise TrainingDiverged(f"training stopped at {where}: {e}. Lower the learning rate, enable "
                               f"gradient clipping (--grad-clip) or check the data", node=e.node, op=e.op) from None
    bad = [k for k, v in {**params, **buffers}.items() if not np.all(np.isfinite(v))]
    if bad:
        raise TrainingDiverged(f"training stopped at {where}: parameters or buffers hold NaN/Inf: {bad[:5]}")
    if not np.all(np.isfinite(x)):
        raise TrainingDiverged(f"training stopped at {where}: the input batch holds NaN/Inf")
    raise TrainingDiverged(f"training stopped at {where}: the loss or gradient norm is not finite "
                           f"(overflow in the norm) but no graph node produced NaN/Inf")


class MetricsLog:
    """JSON lines, one object per record. ``rewrite(records)`` replaces the file atomically (used
    on resume, so the log matches the checkpoint's history exactly)."""

    def __init__(self, path):
        self.path = path

    def append(self, record):
        if self.path is None:
            return
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
            f.flush()

    def rewrite(self, records):
        if self.path is None:
            return
        atomic_write(self.path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records).encode())


def progress_enabled(quiet):
    return not quiet and sys.stderr.isatty()


class Progress:
    """An epochs bar and a steps bar (tqdm), or nothing when disabled."""

    def __init__(self, enabled, epochs, start_epoch):
        self.enabled = enabled
        self.epochs = self.steps = None
        if enabled:
            from tqdm import tqdm
            self._tqdm = tqdm
            self.epochs = tqdm(total=epochs, initial=start_epoch, desc="epochs", position=0, unit="epoch")

    def start_epoch(self, epoch, total_batches, done):
        if self.enabled:
            self.steps = self._tqdm(total=total_batches, initial=done, desc=f"epoch {epoch + 1}", position=1,
                                    leave=False, unit="batch")

    def batch(self, loss):
        if self.steps is not None:
            self.steps.update(1)
            self.steps.set_postfix(loss=f"{loss:.4f}", refresh=False)

    def end_epoch(self, record):
        if self.enabled:
            if self.steps is not None:
                self.steps.close()
            self.epochs.update(1)
            post = {k: f"{record[k]:.4f}" for k in ("train_loss", "test_acc") if record.get(k) is not None}
            self.epochs.set_postfix(post)

    def close(self):
        for b in (self.steps, self.epochs):
            if b is not None:
                b.close()
