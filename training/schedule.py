"""Learning-rate schedules as pure functions of the optimiser step (0-based: the step about to be
taken). Because ``lr(step)`` depends on nothing else, a resumed run needs only the step count
and the schedule's configuration, both stored in the checkpoint.

- ``constant``: ``base_lr``.
- ``step``: ``base_lr * gamma ** (step // step_size)`` (torch StepLR, counted in steps).
- ``cosine``: ``min_lr + (base_lr - min_lr) * (1 + cos(pi * step / total)) / 2`` (torch
  CosineAnnealingLR over ``total`` steps, held at ``min_lr`` afterwards).
- any of them with ``warmup`` steps of linear warm-up first: ``base_lr * (step + 1) / warmup``
  for ``step < warmup``; the wrapped schedule then starts from its own step 0.
"""
from __future__ import annotations

import math

from kiln.frontend.errors import KilnError, UsageError


class Schedule:
    def __init__(self, kind="constant", base_lr=1e-3, *, step_size=1, gamma=0.1, total=1, min_lr=0.0,
                 warmup=0):
        if kind not in ("constant", "step", "cosine"):
            raise UsageError(f"unknown schedule {kind!r}; known: constant, step, cosine")
        if step_size < 1 or total < 1 or warmup < 0:
            raise KilnError(f"schedule {kind}: step_size and total must be >= 1 and warmup >= 0, "
                            f"got step_size={step_size}, total={total}, warmup={warmup}")
        self.kind, self.base_lr = kind, float(base_lr)
        self.step_size, self.gamma, self.total = int(step_size), float(gamma), int(total)
        self.min_lr, self.warmup = float(min_lr), int(warmup)

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return self.base_lr * (step + 1) / self.warmup
        s = step - self.warmup
        if self.kind == "step":
            return self.base_lr * self.gamma ** (s // self.step_size)
        if self.kind == "cosine":
            s = min(s, self.total)
            return self.min_lr + (self.base_lr - self.min_lr) * (1 + math.cos(math.pi * s / self.total)) / 2
        return self.base_lr

    def config(self):
        return {"kind": self.kind, "base_lr": self.base_lr, "step_size": self.step_size, "gamma": self.gamma,
                "total": self.total, "min_lr": self.min_lr, "warmup": self.warmup}

    @classmethod
    def from_config(cls, d):
        d = dict(d)
        return cls(d.pop("kind"), d.pop("base_lr"), **d)

    def __repr__(self):
        return f"Schedule({self.config()})"
