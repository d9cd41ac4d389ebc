"""Optimisers in NumPy: SGD (momentum, Nesterov, weight decay), Adam and AdamW, with the update
rules of ``torch.optim`` (same defaults, same order of operations).

Parameters are a dict ``name -> ndarray`` updated in place. Gradients are either passed to
``step(grads)`` or accumulated explicitly first::

    opt.zero_grad()
    for micro in micro_batches:                  # k micro-batches of n_i samples
        opt.accumulate(grads(micro), n_i / n)    # weight: the micro-batch's share of the samples
    opt.step()                                   # same update as one batch of n samples

For losses that average over the batch this gives the update of the big batch (to rounding).
``state_dict()`` holds everything needed to continue bit-identically (step count, moments).
"""
from __future__ import annotations

import numpy as np

from kiln.frontend.errors import KilnError, UsageError


class Optimizer:
    name = "optimizer"
    hyper = ("lr",)
    slots: tuple = ()

    def __init__(self, params: dict, lr):
        self.params = params
        self.lr = float(lr)
        self.t = 0
        self.state = {s: {} for s in self.slots}
        self.grad: dict | None = None

    # ---- explicit gradient buffers --------------------------------------------------------
    def zero_grad(self):
        self.grad = {k: np.zeros_like(p) for k, p in self.params.items()}

    def accumulate(self, grads: dict, weight=1.0):
        if self.grad is None:
            self.zero_grad()
        for k, g in grads.items():
            if k not in self.grad:
                raise KilnError(f"gradient for unknown parameter {k!r}")
            if weight == 1.0:
                self.grad[k] += g
            else:
                self.grad[k] += np.asarray(g) * np.asarray(weight, self.grad[k].dtype)

    def step(self, grads: dict | None = None):
        """Apply one update with ``grads`` (or the accumulated gradients, which are then cleared)."""
        if grads is None:
            if self.grad is None:
                raise KilnError("optimizer.step() without gradients: pass grads or call accumulate() first")
            grads, self.grad = self.grad, None
        missing = [k for k in self.params if k not in grads]
        if missing:
            raise KilnError(f"optimizer.step(): no gradient for parameters {missing}")
        self.t += 1
        for k, p in self.params.items():
            g = np.asarray(grads[k], p.dtype)
            self._update(k, p, g)

    def _update(self, name, p, g):
        raise NotImplementedError

    def _slot(self, slot, name, like):
        s = self.state[slot]
        if name not in s:
            s[name] = np.zeros_like(like)
        return s[name]

    # ---- checkpointing --------------------------------------------------------------------
    def config(self):
        return {"name": self.name, **{h: getattr(self, h) for h in self.hyper}}

    def state_dict(self):
        return {"config": self.config(), "t": self.t,
                "slots": {s: {k: v.copy() for k, v in d.items()} for s, d in self.state.items()}}

    def load_state_dict(self, sd):
        cfg = sd.get("config", {})
        if cfg.get("name") != self.name:
            raise KilnError(f"optimizer state is for {cfg.get('name')!r}, this optimizer is {self.name!r}")
        for h in self.hyper:
            if h in cfg:
                setattr(self, h, cfg[h])
        self.t = int(sd["t"])
        self.state = {s: {} for s in self.slots}
        for s, d in sd.get("slots", {}).items():
            if s not in self.state:
                raise KilnError(f"optimizer state has unknown slot {s!r} for {self.name}")
            for k, v in d.items():
                if k not in self.params or np.shape(v) != self.params[k].shape:
                    raise KilnError(f"optimizer slot {s}/{k}: shape {np.shape(v)} does not match the "
                                    f"parameter ({self.params[k].shape if k in self.params else 'missing'})")
                self.state[s][k] = np.array(v, dtype=self.params[k].dtype)


class SGD(Optimizer):
    """torch.optim.SGD: d = g + wd * p; b = mu * b + (1 - dampening) * d (b = d at the first
    step); d = d + mu * b (Nesterov) or b; p -= lr * d."""
    name = "sgd"
    hyper = ("lr", "momentum", "dampening", "nesterov", "weight_decay")
    slots = ("momentum_buffer",)

    def __init__(self, params, lr=0.01, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0):
        if nesterov and (momentum <= 0 or dampening != 0):
            raise KilnError("Nesterov momentum needs momentum > 0 and dampening = 0")
        super().__init__(params, lr)
        self.momentum, self.dampening = float(momentum), float(dampening)
        self.nesterov, self.weight_decay = bool(nesterov), float(weight_decay)

    def _update(self, name, p, g):
        if self.weight_decay:
            g = g + self.weight_decay * p
        if self.momentum:
            bufs = self.state["momentum_buffer"]
            if name not in bufs:
                bufs[name] = g.copy()
            else:
                b = bufs[name]
                b *= self.momentum
                b += (1.0 - self.dampening) * g
            b = bufs[name]
            g = g + self.momentum * b if self.nesterov else b
        p -= self.lr * g


class Adam(Optimizer):
    """torch.optim.Adam (L2 weight decay added to the gradient); AdamW decays the weights."""
    name = "adam"
    hyper = ("lr", "beta1", "beta2", "eps", "weight_decay")
    slots = ("exp_avg", "exp_avg_sq")
    decoupled = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params, lr)
        self.beta1, self.beta2 = float(betas[0]), float(betas[1])
        self.eps, self.weight_decay = float(eps), float(weight_decay)

    def _update(self, name, p, g):
        if self.weight_decay:
            if self.decoupled:
                p *= 1.0 - self.lr * self.weight_decay
            else:
                g = g + self.weight_decay * p
        m = self._slot("exp_avg", name, p)
        v = self._slot("exp_avg_sq", name, p)
        b1, b2 = self.beta1, self.beta2
        m *= b1
        m += (1.0 - b1) * g
        v *= b2
        v += (1.0 - b2) * (g * g)
        bc1 = 1.0 - b1 ** self.t
        bc2 = 1.0 - b2 ** self.t
        denom = np.sqrt(v) / np.sqrt(bc2) + self.eps
        p -= (self.lr / bc1) * (m / denom)


class AdamW(Adam):
    name = "adamw"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(params, lr, betas, eps, weight_decay)

    decoupled = True


OPTIMIZERS = {"sgd": SGD, "adam": Adam, "adamw": AdamW}


def make_optimizer(name, params, lr, momentum=0.9, nesterov=False, weight_decay=None):
    """Build an optimiser by CLI name; ``momentum``/``nesterov`` apply to SGD only and
    ``weight_decay=None`` keeps each optimiser's own default (0, or 0.01 for AdamW)."""
    if name not in OPTIMIZERS:
        raise UsageError(f"unknown optimizer {name!r}; known: {', '.join(OPTIMIZERS)}")
    kw = {} if weight_decay is None else {"weight_decay": weight_decay}
    if name == "sgd":
        return SGD(params, lr, momentum=momentum, nesterov=nesterov, **kw)
    return OPTIMIZERS[name](params, lr, **kw)
