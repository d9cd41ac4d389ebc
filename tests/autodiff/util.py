"""Helpers shared by the autodiff tests: trace in float64, Kiln VJP vs torch.autograd."""
import numpy as np
import torch

import kiln.frontend as kf
from kiln.autodiff import vjp
from kiln.frontend.types import TensorType


def trace64(fn, *arrays, name=None):
    return kf.trace(fn, *[TensorType(np.shape(a), "float64") for a in arrays], name=name)


def kiln_vjp(fn, *arrays, u=None):
    """Kiln's d<fn(*arrays), u>/d(arrays) (u defaults to ones)."""
    g = trace64(fn, *arrays)
    gv = vjp(g, wrt=g.inputs)
    u = np.ones(g.types[g.outputs[0]].shape) if u is None else u
    return kf.run(gv, *arrays, u)


def torch_vjp(fn, *arrays, u=None):
    ts = [torch.tensor(np.asarray(a, np.float64), requires_grad=True) for a in arrays]
    y = fn(*ts)
    u = torch.ones_like(y) if u is None else torch.tensor(u)
    return [g.numpy() for g in torch.autograd.grad(y, ts, u)]
