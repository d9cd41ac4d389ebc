"""Run a Kiln graph with PyTorch eager ops (benchmark baseline, not a Kiln backend).

Every node becomes the matching ``torch`` call on NHWC tensors (convolutions go through
``permute`` views, which PyTorch treats as channels-last), so "PyTorch eager" in the benchmarks
is the same model, same layout, same batch, differentiated by ``torch.autograd``. Dropout uses
PyTorch's RNG (timing only). Used by benchmarks/host_llvm_bench.py and benchmarks/gpu_bench.py.
"""
from __future__ import annotations

import numpy as np

from kiln.frontend.ops._util import norm_axes
from kiln.frontend.ops.nn import conv_geometry, pool_geometry
from kiln.frontend.ops.reduce_shape import resolve_shape


def _act(y, act):
    import torch
    if act == "relu":
        return torch.relu(y)
    if act == "relu6":
        return torch.clamp(y, 0, 6)
    return y


def _conv(x, w, b, a, torch):
    G = conv_geometry(tuple(x.shape), tuple(w.shape), a)
    xc = x.permute(0, 3, 1, 2)
    if G["pt"] or G["pb"] or G["pl"] or G["pr"]:
        xc = torch.nn.functional.pad(xc, (G["pl"], G["pr"], G["pt"], G["pb"]))
    y = torch.nn.functional.conv2d(xc, w.permute(0, 3, 1, 2), b, stride=tuple(a["stride"]),
                                   dilation=tuple(a["dilation"]), groups=a["groups"])
    return y.permute(0, 2, 3, 1)


def _pool(x, a, kind, torch):
    G = pool_geometry(tuple(x.shape), a)
    xc = x.permute(0, 3, 1, 2)
    pads = (G["pl"], G["pr"], G["pt"], G["pb"])
    st = (G["sh"], G["sw"])
    k = (G["KH"], G["KW"])
    if kind == "max":
        if any(pads):
            xc = torch.nn.functional.pad(xc, pads, value=-float("inf"))
        y = torch.nn.functional.max_pool2d(xc, k, st)
    else:
        if any(pads):
            s = torch.nn.functional.avg_pool2d(torch.nn.functional.pad(xc, pads), k, st, divisor_override=1)
            if a.get("count_include_pad"):
                y = s / (k[0] * k[1])
            else:
                ones = torch.nn.functional.pad(torch.ones_like(xc[:1, :1]), pads)
                y = s / torch.nn.functional.avg_pool2d(ones, k, st, divisor_override=1)
        else:
            y = torch.nn.functional.avg_pool2d(xc, k, st)
    return y.permute(0, 2, 3, 1)


def _red(x, a, fn):
    axes = norm_axes(a["axes"], x.ndim)
    if not axes:
        return x
    return fn(x, dim=axes, keepdim=a["keepdims"])


def run(graph, feeds, tensors, torch=None):
    """Outputs of ``graph`` as torch tensors; ``feeds`` and ``tensors`` map names to torch tensors."""
    import torch as _torch
    torch = torch or _torch
    F = torch.nn.functional
    env = dict(tensors)
    env.update(feeds)
    for n in graph.nodes:
        xs = [env[i] for i in n.inputs]
        a = n.attrs
        op = n.op
        if op == "conv2d":
            y = _act(_conv(xs[0], xs[1], xs[2] if len(xs) == 3 else None, a, torch), a["activation"])
        elif op == "dense":
            y = _act(F.linear(xs[0], xs[1], xs[2] if len(xs) == 3 else None), a["activation"])
        elif op == "matmul":
            y = torch.matmul(xs[0], xs[1])
        elif op in ("add", "sub", "mul", "div", "maximum", "minimum", "equal", "not_equal", "less", "less_equal",
                    "greater", "greater_equal", "logical_and", "logical_or"):
            y = getattr(torch, {"sub": "sub", "div": "div", "equal": "eq", "not_equal": "ne", "less": "lt",
                                "less_equal": "le", "greater": "gt", "greater_equal": "ge"}.get(op, op))(xs[0], xs[1])
        elif op in ("neg", "exp", "log", "sqrt", "tanh", "sigmoid", "relu", "logical_not"):
            y = getattr(torch, op)(xs[0])
        elif op == "relu6":
            y = torch.clamp(xs[0], 0, 6)
        elif op == "pow":
            y = torch.pow(xs[0], a["exponent"])
        elif op == "where":
            y = torch.where(xs[0], xs[1], xs[2])
        elif op == "cast":
            y = xs[0].to(getattr(torch, a["dtype"]))
        elif op == "sum":
            y = _red(xs[0], a, torch.sum)
        elif op == "mean":
            y = _red(xs[0], a, torch.mean)
        elif op == "max":
            y = _red(xs[0], a, torch.amax)
        elif op == "softmax":
            y = torch.softmax(xs[0], a["axis"])
        elif op == "log_softmax":
            y = torch.log_softmax(xs[0], a["axis"])
        elif op == "reshape":
            y = xs[0].reshape(resolve_shape(a["shape"], xs[0].numel()))
        elif op == "transpose":
            y = xs[0].permute(*(a["perm"] or reversed(range(xs[0].ndim))))
        elif op == "broadcast_to":
            y = xs[0].expand(*a["shape"])
        elif op == "concat":
            y = torch.cat(xs, a["axis"])
        elif op == "pad":
            p = a["pads"]
            flat = []
            for d in reversed(range(xs[0].ndim)):
                flat += [p[2 * d], p[2 * d + 1]]
            y = F.pad(xs[0], flat, value=a["value"])
        elif op == "slice":
            st = a["strides"] or [1] * xs[0].ndim
            y = xs[0][tuple(slice(b, e, s) for b, e, s in zip(a["begin"], a["end"], st))]
        elif op == "max_pool2d":
            y = _pool(xs[0], a, "max", torch)
        elif op == "avg_pool2d":
            y = _pool(xs[0], a, "avg", torch)
        elif op == "dropout":
            y = F.dropout(xs[0], a["rate"], training=True)
        else:
            raise NotImplementedError(f"benchmarks/torch_graph.py: no PyTorch mapping for '{op}' (node {n.name!r})")
        env[n.name] = y
    return [env[o] for o in graph.outputs]


def to_torch(arrays, requires_grad=(), torch=None, device="cpu"):
    import torch as _torch
    torch = torch or _torch
    out = {}
    for k, v in arrays.items():
        t = torch.from_numpy(np.ascontiguousarray(v)).to(device)
        if k in requires_grad:
            t.requires_grad_(True)
        out[k] = t
    return out
