"""Monitoring: gradient norms (global and per layer) and clipping, divergence detection (a loss
exploding against its running minimum; NaN/Inf with a check-mode re-run that names the node),
the JSON-lines metrics log and the tqdm progress bars."""
from __future__ import annotations

import collections
import json
import math
import os
import sys

import numpy as np

from kiln.frontend.errors import CheckFailed, NumericsError
from kiln.frontend.files import atomic_write, output_error


class TrainingDiverged(NumericsError, CheckFailed):
    """The run diverged: the loss or a gradient became NaN/Inf (``node`` and ``op`` name the first
    node that produced it, from a check-mode re-run of the step graph), or the loss exploded
    against its running minimum (``layer`` names the first layer whose gradient norm blew up)."""

    def __init__(self, message, node=None, op=None, layer=None):
        super().__init__(message, node=node, op=op)
        self.layer = layer


def squared_norms(grads: dict) -> dict:
    """name -> sum of squares of that gradient, accumulated in float64."""
    out = {}
    for k, g in grads.items():
        g = np.asarray(g, np.float64).ravel()
        out[k] = float(np.dot(g, g))
    return out


def global_norm(grads: dict, squares: dict | None = None) -> float:
    """sqrt of the sum of squares of every gradient (accumulated in float64, as
    torch.nn.utils.clip_grad_norm_ reports it). ``squares``: :func:`squared_norms` of ``grads``,
    when already computed."""
    s = 0.0
    for v in (squares if squares is not None else squared_norms(grads)).values():
        s += v
    return math.sqrt(s)


def layer_of(param_name: str) -> str:
    """The layer a parameter belongs to: its name without the last part ("conv1.weight" -> "conv1")."""
    return param_name.rsplit(".", 1)[0]


def layer_norms(squares: dict) -> dict:
    """layer -> gradient norm of all its parameters, in parameter order (input side first)."""
    acc = {}
    for k, v in squares.items():
        acc[layer_of(k)] = acc.get(layer_of(k), 0.0) + v
    return {k: math.sqrt(v) for k, v in acc.items()}


class DivergenceMonitor:
    """Stops a run whose loss explodes while still finite (NaN/Inf are caught before it).

    A step diverges when its training loss exceeds ``factor`` times the lowest step loss so far;
    that minimum is floored at 1/100 of the first step's loss, so a loss that has fallen close to 0
    does not turn ordinary batch-to-batch noise into a divergence. Every step also records each
    layer's gradient norm against that layer's running minimum (floored the same way): the layer
    named is the first one whose norm grew past ``factor`` times its minimum, in the earliest of the
    last ``WINDOW`` steps where one did (the layer nearest the input among that step's), else the
    layer whose norm grew most in the diverging step. The state (minima) goes into checkpoints."""

    WINDOW = 64
    FLOOR = 1e-2

    def __init__(self, factor, kinds=None):
        self.factor = factor
        self.kinds = kinds or {}               # layer -> its module's class name, for messages
        self.first_loss = self.best_loss = None
        self.first_norm, self.min_norm = {}, {}
        self.recent = collections.deque(maxlen=self.WINDOW)    # (step, [(layer, norm, ratio), ...])

    def state_dict(self):
        return {"first_loss": self.first_loss, "best_loss": self.best_loss, "first_norm": dict(self.first_norm),
                "min_norm": dict(self.min_norm)}

    def load_state_dict(self, sd):
        self.first_loss, self.best_loss = sd.get("first_loss"), sd.get("best_loss")
        self.first_norm, self.min_norm = dict(sd.get("first_norm", {})), dict(sd.get("min_norm", {}))

    def _ratio(self, layer, norm):
        if not math.isfinite(norm):
            return math.inf
        ref = max(self.min_norm.get(layer, norm), self.FLOOR * self.first_norm.get(layer, norm))
        return norm / ref if ref > 0 else 1.0

    def observe(self, step, loss, norms):
        """Record step ``step`` (its mean loss and :func:`layer_norms`); return None, or when the
        loss exploded a description ``(text, layer)`` (the caller raises TrainingDiverged)."""
        ratios = [(k, n, self._ratio(k, n)) for k, n in norms.items()]
        self.recent.append((step, ratios))
        verdict = None
        if self.factor and self.best_loss is not None:
            ref = max(self.best_loss, self.FLOOR * self.first_loss)
            if ref > 0 and loss > self.factor * ref:
                verdict = (f"the loss is {loss:.3g}, {loss / ref:.3g} times its running minimum {ref:.3g} "
                           f"(limit: {self.factor:g} times, --divergence-factor)")
        if verdict is None:
            self._update(loss, norms)
            return None
        text, layer = self.blame()
        return f"{verdict}. {text}", layer

    def _update(self, loss, norms):
        if self.first_loss is None:
            self.first_loss = loss
        self.best_loss = loss if self.best_loss is None else min(self.best_loss, loss)
        for k, n in norms.items():
            if math.isfinite(n):
                self.first_norm.setdefault(k, n)
                self.min_norm[k] = min(self.min_norm.get(k, n), n)

    def blame(self):
        """(sentence, layer) naming the first layer whose gradient norm blew up, or ("", None)."""
        for step, ratios in self.recent:
            for layer, norm, ratio in ratios:
                if self.factor and ratio > self.factor:
                    return (f"The first layer whose gradient norm blew up: {self._name(layer)} at step {step} "
                            f"(|grad| {norm:.3g}, {ratio:.3g} times its running minimum)", layer)
        if not self.recent or not self.recent[-1][1]:
            return "", None
        step, ratios = self.recent[-1]
        layer, norm, ratio = max(ratios, key=lambda t: t[2])
        return (f"No layer's gradient norm grew past the limit; the most grown at step {step}: {self._name(layer)} "
                f"(|grad| {norm:.3g}, {ratio:.3g} times its running minimum)", layer)

    def _name(self, layer):
        kind = self.kinds.get(layer)
        return f"{layer!r} ({kind})" if kind else repr(layer)


def clip_by_global_norm(grads: dict, max_norm: float, norm: float):
    """Scale all gradients by max_norm / (norm + 1e-6) when that is below 1 (torch's rule)."""
    coef = max_norm / (norm + 1e-6)
    if coef >= 1.0:
        return grads
    return {k: (g * np.asarray(coef, g.dtype)) for k, g in grads.items()}


def _bad_rows(a):
    """Indices of the rows (samples) of a float batch that hold NaN/Inf."""
    a = np.asarray(a)
    if a.dtype.kind not in "fc" or a.ndim == 0:
        return []
    return np.flatnonzero(~np.isfinite(a.reshape(len(a), -1)).all(axis=1)).tolist()


def diagnose(step_graph, params, buffers, x, y, key, where, blame=""):
    """Find why a step's loss or gradient norm is not finite and raise TrainingDiverged: first the
    batch itself (inputs, float targets), then the parameters and buffers, then a re-run of the
    step in check mode naming the first node that produced NaN/Inf. ``blame``: a sentence added
    to the message (the first layer whose gradient norm blew up)."""
    tail = (f" {blame}." if blame else "")
    for what, arr in (("input batch", x), ("target batch", y)):
        rows = _bad_rows(arr) if arr is not None else []
        if rows:
            raise TrainingDiverged(f"training stopped at {where}: the {what} holds NaN/Inf (rows {rows[:8]} of "
                                   f"{len(arr)}): the data is bad, not the model; clean the dataset")
    bad = [k for k, v in {**params, **buffers}.items() if not np.all(np.isfinite(v))]
    if bad:
        raise TrainingDiverged(f"training stopped at {where}: parameters or buffers hold NaN/Inf: {bad[:5]}.{tail} "
                               f"Lower the learning rate or enable gradient clipping (--grad-clip)")
    try:
        step_graph(params, buffers, x, y, key, check=True)
    except NumericsError as e:
        raise TrainingDiverged(f"training stopped at {where}: {e}.{tail} Lower the learning rate, enable "
                               f"gradient clipping (--grad-clip) or check the data", node=e.node, op=e.op) from None
    raise TrainingDiverged(f"training stopped at {where}: the loss or gradient norm is not finite "
                           f"(overflow in the norm) but no graph node produced NaN/Inf.{tail}")


class MetricsLog:
    """JSON lines, one object per record. ``rewrite(records)`` replaces the file atomically (used
    on resume, so the log matches the checkpoint's history exactly)."""

    def __init__(self, path):
        self.path = path

    def append(self, record):
        if self.path is None:
            return
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            with open(self.path, "a") as f:
                f.write(json.dumps(record, sort_keys=True) + "\n")
                f.flush()
        except OSError as e:
            raise output_error(e, self.path, "metrics log") from e

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
