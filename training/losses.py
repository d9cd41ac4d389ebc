"""Losses built from graph nodes (the functional API), so the autodiff differentiates them.

Every loss takes traced tensors and returns a scalar tensor, averaged over the batch
(``reduction="mean"``, the default) or summed (``"sum"``). Class targets are integer label
tensors ([N] for logits [N, C]; the class axis is the last one); they become one-hot rows inside
the graph (``equal`` against a constant ``arange``), so the step graph takes labels as an int64
input and nothing is differentiated with respect to them.

- ``cross_entropy(logits, labels, label_smoothing=0)``: through ``log_softmax``, which subtracts
  the row maximum, so logits of +-1e4 give finite losses and gradients.
- ``nll_loss(log_probs, labels)``: negative log-likelihood of given log-probabilities.
- ``mse_loss(pred, target)``: mean of squared differences over all elements.
- ``bce_with_logits(logits, target)``: binary cross-entropy on logits, in the stable form
  ``max(x, 0) - x * t + log(1 + exp(-|x|))``.
"""
from __future__ import annotations

import math

import numpy as np

from kiln.frontend import functional as F
from kiln.frontend.errors import ShapeError, UsageError


def _reduce(per_item, reduction, count):
    total = F.sum(per_item)
    if reduction == "sum":
        return total
    if reduction == "mean":
        return total * (1.0 / count)
    raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")


def one_hot(labels, num_classes, dtype="float32"):
    """Integer labels [...] -> float one-hot [..., num_classes], as graph nodes."""
    if labels.type.is_float:
        raise ShapeError(f"class targets must be integer labels, got {labels.type}")
    classes = np.arange(num_classes, dtype=labels.dtype)
    col = F.reshape(labels, tuple(labels.shape) + (1,))
    return F.cast(F.equal(col, classes), dtype)


def _class_targets(scores, labels, label_smoothing):
    if scores.ndim < 1 or tuple(labels.shape) != tuple(scores.shape[:-1]):
        raise ShapeError(f"labels of shape {labels.shape} do not match scores {scores.shape} "
                         f"(expected labels of shape {scores.shape[:-1]}, classes on the last axis)")
    c = scores.shape[-1]
    t = one_hot(labels, c, scores.dtype)
    if label_smoothing:
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
        t = t * (1.0 - label_smoothing) + label_smoothing / c
    return t


def nll_loss(log_probs, labels, reduction="mean", label_smoothing=0.0):
    t = _class_targets(log_probs, labels, label_smoothing)
    return _reduce(-(t * log_probs), reduction, math.prod(log_probs.shape[:-1]))


def cross_entropy(logits, labels, reduction="mean", label_smoothing=0.0):
    """Softmax cross-entropy of ``logits`` [..., C] against integer ``labels`` [...] (PyTorch's
    ``F.cross_entropy`` with the class axis last, including its label smoothing)."""
    return nll_loss(F.log_softmax(logits, -1), labels, reduction, label_smoothing)


def mse_loss(pred, target, reduction="mean"):
    if tuple(pred.shape) != tuple(target.shape):
        raise ShapeError(f"mse_loss: prediction {pred.shape} and target {target.shape} differ")
    d = pred - target
    return _reduce(d * d, reduction, pred.size)


def bce_with_logits(logits, target, reduction="mean"):
    if tuple(logits.shape) != tuple(target.shape):
        raise ShapeError(f"bce_with_logits: logits {logits.shape} and target {target.shape} differ")
    # max(x, 0) and -|x| through one where-condition, so the kinks at x = 0 cancel in the gradient
    # (sigmoid(0) - t, as torch gives) instead of mixing relu'(0) = 0 with abs'(0) = 1
    pos = logits >= 0.0
    per = F.where(pos, logits, 0.0) - logits * target + F.log(1.0 + F.exp(F.where(pos, -logits, logits)))
    return _reduce(per, reduction, logits.size)


# name -> (function, what the target is): "labels" (int class labels), "target" (a float array
# shaped like the prediction), "input" (reconstruct the input: autoencoders)
LOSSES = {
    "cross_entropy": (cross_entropy, "labels"),
    "nll": (nll_loss, "labels"),
    "mse": (mse_loss, "target"),
    "mse_reconstruction": (mse_loss, "input"),
    "bce_with_logits": (bce_with_logits, "target"),
}


def get_loss(name):
    try:
        return LOSSES[name]
    except KeyError:
        raise UsageError(f"unknown loss {name!r}; known: {', '.join(LOSSES)}") from None
