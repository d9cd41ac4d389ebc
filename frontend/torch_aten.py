"""The ATen converter table of the PyTorch importer: ``ATEN[name] = fn(builder, args, node)``, keyed
by overload (``conv2d.padding``) or by op (``conv2d``). ``args`` holds the op's schema arguments by
name (import_blocks.V for tensors). Covers the ops ``torch.export`` records for the layers MCU
models are built from, in its default (pre-dispatch) form and in core ATen form."""
from __future__ import annotations

import operator

from . import import_blocks as B
from . import import_nn as NN
from .import_blocks import UnsupportedError
from .import_layout import V
from .import_rnn import rnn

ATEN = {}


def aten(*names):
    def deco(fn):
        for n in names:
            ATEN[n] = fn
        return fn
    return deco


def _s(v):
    """A Python scalar from a scalar argument or a 0-d constant."""
    return v.array.item() if isinstance(v, V) else v


def _operand(b, v, like):
    return v if isinstance(v, V) else B.scalar(b, v, like)


# ---- linear layers -------------------------------------------------------------------------------
@aten("conv1d", "conv2d")
def _conv(b, a, node):
    return NN.conv(b, a["input"], a["weight"], a["bias"], a["stride"], a["padding"], a["dilation"], a["groups"])


@aten("convolution", "_convolution")
def _convolution(b, a, node):
    if a["transposed"]:
        raise UnsupportedError("transposed convolution (ConvTranspose)")
    return NN.conv(b, a["input"], a["weight"], a["bias"], a["stride"], a["padding"], a["dilation"], a["groups"])


@aten("linear")
def _linear(b, a, node):
    return NN.linear(b, a["input"], a["weight"], a["bias"])


@aten("addmm")
def _addmm(b, a, node):
    if _s(a["beta"]) != 1 or _s(a["alpha"]) != 1:
        raise UnsupportedError("addmm with alpha/beta other than 1")
    return NN.linear(b, a["mat1"], a["mat2"], a["self"], w_transposed=True)


@aten("mm", "matmul", "bmm")
def _mm(b, a, node):
    x = a.get("self", a.get("input"))
    return NN.matmul(b, x, a["mat2"] if "mat2" in a else a["other"])


# ---- normalisation -------------------------------------------------------------------------------
@aten("batch_norm", "_native_batch_norm_legit_no_training", "_native_batch_norm_legit_functional",
      "native_batch_norm", "_native_batch_norm_legit")
def _bn(b, a, node):
    y = NN.batch_norm(b, a["input"], a["weight"], a["bias"], a["running_mean"], a["running_var"],
                      _s(a.get("eps", 1e-5)), _s(a.get("momentum", 0.1)))
    return y if node.target.__name__.startswith("batch_norm") else (y, None, None)


# ---- activations ---------------------------------------------------------------------------------
for _name, _op in (("relu", "relu"), ("sigmoid", "sigmoid"), ("tanh", "tanh"), ("exp", "exp"), ("log", "log"),
                   ("sqrt", "sqrt"), ("neg", "neg")):
    ATEN[_name] = ATEN[_name + "_"] = (lambda op: lambda b, a, node: B.unary(b, op, a["self"]))(_op)
ATEN["relu6"] = lambda b, a, node: B.unary(b, "relu6", a["self"])
ATEN["hardswish"] = ATEN["hardswish_"] = lambda b, a, node: B.hardswish(b, a["self"])
ATEN["hardsigmoid"] = ATEN["hardsigmoid_"] = lambda b, a, node: B.hardsigmoid(b, a["self"])
ATEN["silu"] = ATEN["silu_"] = lambda b, a, node: B.silu(b, a["self"])
ATEN["gelu"] = lambda b, a, node: B.gelu(b, a["self"], a.get("approximate", "none"))
ATEN["leaky_relu"] = ATEN["leaky_relu_"] = lambda b, a, node: B.leaky_relu(b, a["self"], _s(a["negative_slope"]))
ATEN["rsqrt"] = lambda b, a, node: B.binary(b, "div", B.scalar(b, 1.0, a["self"]), B.unary(b, "sqrt", a["self"]))


@aten("hardtanh", "hardtanh_", "clamp", "clip", "clamp_min", "clamp_max")
def _clamp(b, a, node):
    name = node.target.overloadpacket.__name__
    lo = a.get("min_val", a.get("min"))
    hi = a.get("max_val", a.get("max"))
    if name == "clamp_min":
        lo, hi = a["min"], None
    if name == "clamp_max":
        lo, hi = None, a["max"]
    return B.clip(b, a["self"], _s(lo), _s(hi))


@aten("softmax", "_softmax", "log_softmax", "_log_softmax")
def _softmax(b, a, node):
    return B.softmax(b, a["self"], a["dim"], log="log_" in node.target.__name__)


# ---- arithmetic ----------------------------------------------------------------------------------
def _arith(op):
    def fn(b, a, node):
        x, y = a["self"], a["other"]
        alpha = _s(a.get("alpha", 1))
        if not isinstance(x, V):
            x = B.scalar(b, x, y)
        y = _operand(b, y, x)
        if alpha != 1:
            y = B.binary(b, "mul", y, B.scalar(b, alpha, y))
        return B.binary(b, op, x, y)
    return fn


for _name, _op in (("add", "add"), ("sub", "sub"), ("mul", "mul"), ("div", "div"), ("maximum", "maximum"),
                   ("minimum", "minimum")):
    ATEN[_name] = ATEN[_name + "_"] = _arith(_op)


@aten("rsub")
def _rsub(b, a, node):
    x = a["self"]
    return B.binary(b, "sub", _operand(b, a["other"], x), x)


@aten("pow")
def _pow(b, a, node):
    e = _s(a.get("exponent"))
    if isinstance(e, V) or e is None:
        raise UnsupportedError("pow with a tensor exponent")
    if e == 2:
        return B.binary(b, "mul", a["self"], a["self"])
    return B.unary(b, "pow", a["self"], exponent=float(e))


# ---- shapes --------------------------------------------------------------------------------------
@aten("view", "reshape", "_unsafe_view", "view_copy")
def _view(b, a, node):
    return B.reshape(b, a["self"], [_s(s) for s in (a.get("size") or a.get("shape"))])


@aten("flatten")
def _flatten(b, a, node):
    x = a.get("self", a.get("input"))
    s, e = a["start_dim"] % max(x.rank, 1), a["end_dim"] % max(x.rank, 1)
    return B.reshape(b, x, list(x.shape[:s]) + [-1] + list(x.shape[e + 1:]))


@aten("permute")
def _permute(b, a, node):
    return B.permute(b, a["self"], a["dims"])


@aten("transpose", "swapaxes")
def _transpose(b, a, node):
    x = a["self"]
    p = list(range(x.rank))
    d0, d1 = a.get("dim0", a.get("axis0")) % x.rank, a.get("dim1", a.get("axis1")) % x.rank
    p[d0], p[d1] = p[d1], p[d0]
    return B.permute(b, x, p)


@aten("t", "numpy_T")
def _t(b, a, node):
    x = a["self"]
    return B.permute(b, x, list(range(x.rank))[::-1])


@aten("unsqueeze")
def _unsqueeze(b, a, node):
    x = a["self"]
    d = a["dim"] % (x.rank + 1)
    return B.reshape(b, x, list(x.shape[:d]) + [1] + list(x.shape[d:]))


@aten("squeeze")
def _squeeze(b, a, node):
    x = a["self"]
    dims = a.get("dim")
    dims = range(x.rank) if dims is None else ([dims] if isinstance(dims, int) else dims)
    dims = {d % x.rank for d in dims}
    return B.reshape(b, x, [s for i, s in enumerate(x.shape) if not (i in dims and s == 1)])


@aten("contiguous", "clone", "alias", "detach", "lift_fresh_copy", "dropout", "feature_dropout", "alpha_dropout",
      "_to_copy", "to", "type_as", "native_dropout")
def _identity(b, a, node):
    x = a.get("self", a.get("input"))
    dtype = a.get("dtype")
    if dtype is not None and isinstance(x, V) and not x.is_const:
        want = str(dtype).replace("torch.", "")
        if want != b.g.types[x.name].dtype:
            raise UnsupportedError(f"a cast to {want} inside the model")
    return (x, None) if node.target.__name__.startswith("native_dropout") else x


@aten("cat", "concat", "concatenate")
def _cat(b, a, node):
    xs = [x for x in a["tensors"] if not (x.rank == 1 and x.shape[0] == 0)]
    return B.concat(b, xs, a["dim"])


@aten("stack")
def _stack(b, a, node):
    xs = a["tensors"]
    d = a["dim"] % (xs[0].rank + 1)
    return B.concat(b, [B.reshape(b, x, list(x.shape[:d]) + [1] + list(x.shape[d:])) for x in xs], d)


@aten("slice", "slice_copy")
def _slice(b, a, node):
    x = a["self"]
    start = 0 if a["start"] is None else a["start"]
    end = x.shape[a["dim"] % x.rank] if a["end"] is None else min(a["end"], x.shape[a["dim"] % x.rank])
    return B.slice_(b, x, a["dim"], start, end, a["step"])


@aten("select", "select_copy")
def _select(b, a, node):
    return B.select(b, a["self"], a["dim"], a["index"])


@aten("narrow")
def _narrow(b, a, node):
    return B.slice_(b, a["self"], a["dim"], a["start"], a["start"] + a["length"])


def _split_sizes(n, size):
    return [min(size, n - i) for i in range(0, n, size)]


@aten("split", "split_with_sizes", "chunk", "unbind", "tensor_split")
def _split(b, a, node):
    x = a["self"]
    name = node.target.overloadpacket.__name__
    d = a.get("dim", 0) % x.rank
    n = x.shape[d]
    if name == "unbind":
        return tuple(B.select(b, x, d, i) for i in range(n))
    if name == "chunk":
        sizes = _split_sizes(n, -(-n // a["chunks"]))
    else:
        s = a.get("split_size", a.get("split_sizes", a.get("split_size_or_sections")))
        sizes = _split_sizes(n, s) if isinstance(s, int) else list(s)
    out, start = [], 0
    for s in sizes:
        out.append(B.slice_(b, x, d, start, start + s))
        start += s
    return tuple(out)


@aten("expand")
def _expand(b, a, node):
    x = a["self"]
    size = [x.shape[i - (len(a["size"]) - x.rank)] if s == -1 else s for i, s in enumerate(a["size"])]
    if tuple(size) == x.shape:
        return x
    name = b.plain(x)
    return b.wrap(b.emit("broadcast_to", [name], {"shape": [int(s) for s in size]}, hint="expand"))


@aten("constant_pad_nd", "pad")
def _pad(b, a, node):
    x = a["self"]
    p = [int(v) for v in a["pad"]]           # torch: last axis first, (lo, hi) pairs
    pads = [(0, 0)] * x.rank
    for i in range(len(p) // 2):
        pads[x.rank - 1 - i] = (p[2 * i], p[2 * i + 1])
    mode = a.get("mode", "constant")
    if mode == "constant":
        return B.pad_const(b, x, pads, _s(a.get("value")) or 0.0)
    return B.pad_mode(b, x, pads, mode)


@aten("getitem")
def _getitem(b, a, node):
    return a["args"][0][a["args"][1]]


ATEN[operator.getitem.__name__] = _getitem


# ---- pooling and reductions ----------------------------------------------------------------------
@aten("max_pool1d", "max_pool2d", "max_pool2d_with_indices", "max_pool1d_with_indices")
def _maxpool(b, a, node):
    y = NN.pool(b, "max", a["self"], a["kernel_size"], a["stride"], a["padding"], a["ceil_mode"],
                dilation=a["dilation"])
    return (y, None) if "with_indices" in node.target.__name__ else y


@aten("avg_pool1d", "avg_pool2d")
def _avgpool(b, a, node):
    if a.get("divisor_override") is not None:
        raise UnsupportedError("avg_pool with divisor_override")
    return NN.pool(b, "avg", a["self"], a["kernel_size"], a["stride"], a["padding"], a["ceil_mode"],
                   a["count_include_pad"])


@aten("adaptive_avg_pool1d", "adaptive_avg_pool2d", "_adaptive_avg_pool2d")
def _adaptive_avg(b, a, node):
    return NN.adaptive_pool(b, "avg", a["self"], a["output_size"])


@aten("adaptive_max_pool1d", "adaptive_max_pool2d")
def _adaptive_max(b, a, node):
    return NN.adaptive_pool(b, "max", a["self"], a["output_size"]), None


@aten("mean", "sum", "amax")
def _reduce(b, a, node):
    name = node.target.overloadpacket.__name__
    if a.get("dtype") is not None:
        raise UnsupportedError(f"{name} with a dtype")
    dims = a.get("dim")
    return NN.reduce(b, {"amax": "max"}.get(name, name), a["self"], dims if dims not in ((), []) else None,
                     bool(a.get("keepdim", False)))


@aten("upsample_nearest1d", "upsample_nearest2d")
def _upsample(b, a, node):
    x = a.get("input", a.get("self"))
    sizes, scales = a.get("output_size"), a.get("scale_factors") or [a.get(k) for k in ("scales_h", "scales_w", "scales")
                                                                        if a.get(k) is not None]
    if sizes:
        scales = [o / i for o, i in zip(sizes, x.shape[2:])]
    return NN.upsample_nearest(b, x, scales)


@aten("upsample_bilinear2d", "upsample_linear1d", "upsample_bicubic2d", "_upsample_bilinear2d_aa")
def _upsample_other(b, a, node):
    raise UnsupportedError(f"{node.target.overloadpacket.__name__} (Kiln imports nearest upsampling)")


# ---- recurrent -----------------------------------------------------------------------------------
def _rnn_params(flat, layers, bidirectional, has_biases):
    per = 4 if has_biases else 2
    D = 2 if bidirectional else 1
    out = []
    for li in range(layers):
        dirs = []
        for di in range(D):
            p = flat[(li * D + di) * per:(li * D + di + 1) * per]
            dirs.append({"w_ih": p[0], "w_hh": p[1], "b_ih": p[2] if has_biases else None,
                         "b_hh": p[3] if has_biases else None})
        out.append(dirs)
    return out


@aten("lstm")
def _lstm(b, a, node):
    h0, c0 = a["hx"]
    if a["params"][1].shape[1] != h0.shape[-1] or len(a["params"]) % 4 and len(a["params"]) % 2:
        raise UnsupportedError("LSTM with proj_size")
    layers = _rnn_params(a["params"], a["num_layers"], a["bidirectional"], a["has_biases"])
    return rnn(b, "lstm", a["input"], layers, a["batch_first"], h0, c0)


@aten("gru")
def _gru(b, a, node):
    layers = _rnn_params(a["params"], a["num_layers"], a["bidirectional"], a["has_biases"])
    y, h, _ = rnn(b, "gru", a["input"], layers, a["batch_first"], a["hx"])
    return y, h
