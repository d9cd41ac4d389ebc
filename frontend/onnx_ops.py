"""The ONNX converter table: ``ONNX[op_type] = fn(builder, node, inputs, attrs, converter)``
(inputs: import_blocks.V, None for an omitted optional input). Semantics follow the ONNX operator
specification for opsets 13+; an attribute value Kiln does not import raises UnsupportedError
naming it."""
from __future__ import annotations

import math

import numpy as np

from . import import_blocks as B
from . import import_nn as NN
from .import_blocks import UnsupportedError
from .import_layout import V
from .import_rnn import rnn

ONNX = {}
NO_FOLD = {"QuantizeLinear", "DequantizeLinear"}      # kept for the QDQ pass


def op(*names):
    def deco(fn):
        for n in names:
            ONNX[n] = fn
        return fn
    return deco


def _const(v, what):
    if v is None or not v.is_const:
        raise UnsupportedError(f"{what} must be a constant (an initializer or computed from constants)")
    return v.array


def _ints(v, what):
    return [int(t) for t in np.ravel(_const(v, what))]


def static_shape(b, node, x, kind):
    if kind == "Size":
        return b.const(np.asarray(math.prod(x.shape), np.int64))
    shape = np.asarray(x.shape, np.int64)
    a = {at.name: at.i for at in node.attribute}
    return b.const(shape[a.get("start", 0):a.get("end", len(shape))])


# ---- linear layers -------------------------------------------------------------------------------
def _auto_pads(x, attrs, ks, strides, dil):
    ap = attrs.get("auto_pad", "NOTSET")
    nsp = len(ks)
    if ap in ("SAME_UPPER", "SAME_LOWER"):
        return [NN.same_pads(x.shape[2 + i], ks[i], strides[i], dil[i], ap == "SAME_LOWER") for i in range(nsp)]
    if ap == "VALID":
        return [(0, 0)] * nsp
    return NN.pad_pairs(attrs.get("pads", [0] * (2 * nsp)), nsp)


@op("Conv")
def _conv(b, node, ins, attrs, cv):
    x, w = ins[0], ins[1]
    W = _const(w, "Conv weight")
    nsp = W.ndim - 2
    st = list(attrs.get("strides", [1] * nsp))
    dil = list(attrs.get("dilations", [1] * nsp))
    pads = _auto_pads(x, attrs, list(W.shape[2:]), st, dil)
    return NN.conv(b, x, w, ins[2] if len(ins) > 2 else None, st, pads, dil, attrs.get("group", 1))


@op("Gemm")
def _gemm(b, node, ins, attrs, cv):
    a, w = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    if attrs.get("transA", 0):
        a = B.permute(b, a, (1, 0))
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    fused = c is not None and alpha == 1 and beta == 1         # alpha A B + beta C as one dense
    if w.is_const:
        y = NN.linear(b, a, w, c if fused else None, w_transposed=not attrs.get("transB", 0))
    else:
        y = NN.matmul(b, a, B.permute(b, w, (1, 0)) if attrs.get("transB", 0) else w)
    y = B.affine(b, y, alpha)
    if c is not None and not (fused and w.is_const):
        y = B.binary(b, "add", y, B.affine(b, c, beta))
    return y


@op("MatMul")
def _matmul(b, node, ins, attrs, cv):
    return NN.matmul(b, ins[0], ins[1])


@op("BatchNormalization")
def _bn(b, node, ins, attrs, cv):
    if attrs.get("training_mode", 0):
        raise UnsupportedError("BatchNormalization with training_mode=1 (export the model in eval mode)")
    x, scale, bias, mean, var = ins[:5]
    buf = lambda v: V(array=v.array, pname=v.pname, trainable=False, view=v.view) if v.is_const else v
    return NN.batch_norm(b, x, scale, bias, buf(mean), buf(var), attrs.get("epsilon", 1e-5),
                         1.0 - attrs.get("momentum", 0.9))


# ---- activations ---------------------------------------------------------------------------------
for _name, _kop in (("Relu", "relu"), ("Sigmoid", "sigmoid"), ("Tanh", "tanh"), ("Exp", "exp"), ("Log", "log"),
                    ("Sqrt", "sqrt"), ("Neg", "neg")):
    ONNX[_name] = (lambda k: lambda b, node, ins, attrs, cv: B.unary(b, k, ins[0]))(_kop)
ONNX["HardSwish"] = lambda b, node, ins, attrs, cv: B.hardswish(b, ins[0])
ONNX["HardSigmoid"] = lambda b, node, ins, attrs, cv: B.hardsigmoid(b, ins[0], attrs.get("alpha", 0.2),
                                                                       attrs.get("beta", 0.5))
ONNX["LeakyRelu"] = lambda b, node, ins, attrs, cv: B.leaky_relu(b, ins[0], attrs.get("alpha", 0.01))
ONNX["Gelu"] = lambda b, node, ins, attrs, cv: B.gelu(b, ins[0], attrs.get("approximate", "none"))
ONNX["Erf"] = lambda b, node, ins, attrs, cv: B.erf(b, ins[0])
ONNX["Reciprocal"] = lambda b, node, ins, attrs, cv: B.binary(b, "div", B.scalar(b, 1.0, ins[0]), ins[0])
ONNX["Identity"] = lambda b, node, ins, attrs, cv: ins[0]
ONNX["Dropout"] = lambda b, node, ins, attrs, cv: ins[0]


@op("Clip")
def _clip(b, node, ins, attrs, cv):
    lo = ins[1].array.item() if len(ins) > 1 and ins[1] is not None else None
    hi = ins[2].array.item() if len(ins) > 2 and ins[2] is not None else None
    return B.clip(b, ins[0], lo, hi)


@op("Softmax", "LogSoftmax")
def _softmax(b, node, ins, attrs, cv):
    return B.softmax(b, ins[0], attrs.get("axis", -1), log=node.op_type == "LogSoftmax")


@op("Pow")
def _pow(b, node, ins, attrs, cv):
    e = float(np.ravel(_const(ins[1], "Pow exponent"))[0])
    return B.binary(b, "mul", ins[0], ins[0]) if e == 2 else B.unary(b, "pow", ins[0], exponent=e)


# ---- arithmetic ----------------------------------------------------------------------------------
for _name, _kop in (("Add", "add"), ("Sub", "sub"), ("Mul", "mul"), ("Div", "div")):
    ONNX[_name] = (lambda k: lambda b, node, ins, attrs, cv: B.binary(b, k, ins[0], ins[1]))(_kop)


@op("Max", "Min", "Sum")
def _variadic(b, node, ins, attrs, cv):
    k = {"Max": "maximum", "Min": "minimum", "Sum": "add"}[node.op_type]
    y = ins[0]
    for v in ins[1:]:
        y = B.binary(b, k, y, v)
    return y


# ---- shapes --------------------------------------------------------------------------------------
@op("Reshape")
def _reshape(b, node, ins, attrs, cv):
    x = ins[0]
    shape = _ints(ins[1], "Reshape's shape")
    if not attrs.get("allowzero", 0):
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return B.reshape(b, x, shape)


@op("Flatten")
def _flatten(b, node, ins, attrs, cv):
    x = ins[0]
    ax = attrs.get("axis", 1) % (x.rank + 1) if x.rank else 0
    return B.reshape(b, x, [math.prod(x.shape[:ax]), math.prod(x.shape[ax:])])


@op("Transpose")
def _transpose(b, node, ins, attrs, cv):
    x = ins[0]
    return B.permute(b, x, attrs.get("perm", list(range(x.rank))[::-1]))


def _axes(ins, attrs, k=1):
    if len(ins) > k and ins[k] is not None:
        return _ints(ins[k], "axes")
    return attrs.get("axes")


@op("Squeeze")
def _squeeze(b, node, ins, attrs, cv):
    x = ins[0]
    axes = _axes(ins, attrs)
    axes = {a % x.rank for a in axes} if axes is not None else {i for i, s in enumerate(x.shape) if s == 1}
    return B.reshape(b, x, [s for i, s in enumerate(x.shape) if i not in axes])


@op("Unsqueeze")
def _unsqueeze(b, node, ins, attrs, cv):
    x = ins[0]
    axes = sorted(a % (x.rank + len(_axes(ins, attrs))) for a in _axes(ins, attrs))
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return B.reshape(b, x, shape)


@op("Concat")
def _concat(b, node, ins, attrs, cv):
    xs = [v for v in ins if v is not None and math.prod(v.shape) > 0]
    return B.concat(b, xs, attrs["axis"])


@op("Split")
def _split(b, node, ins, attrs, cv):
    x = ins[0]
    ax = attrs.get("axis", 0) % x.rank
    n = x.shape[ax]
    if len(ins) > 1 and ins[1] is not None:
        sizes = _ints(ins[1], "Split's split")
    elif "split" in attrs:
        sizes = list(attrs["split"])
    else:
        k = attrs.get("num_outputs", len(node.output))
        step = -(-n // k)
        sizes = [min(step, n - i) for i in range(0, n, step)]
    out, s0 = [], 0
    for s in sizes:
        out.append(B.slice_(b, x, ax, s0, s0 + s))
        s0 += s
    return out


@op("Slice")
def _slice(b, node, ins, attrs, cv):
    x = ins[0]
    starts, ends = _ints(ins[1], "Slice starts"), _ints(ins[2], "Slice ends")
    axes = _ints(ins[3], "Slice axes") if len(ins) > 3 and ins[3] is not None else list(range(len(starts)))
    steps = _ints(ins[4], "Slice steps") if len(ins) > 4 and ins[4] is not None else [1] * len(starts)
    for s, e, a, st in zip(starts, ends, axes, steps):
        n = x.shape[a % x.rank]
        e = max(min(e, n), -n - 1) if e < 0 else min(e, n)
        x = B.slice_(b, x, a, s, e, st)
    return x


@op("Gather")
def _gather(b, node, ins, attrs, cv):
    x, idx = ins[0], _const(ins[1], "Gather indices (on a computed tensor)")
    ax = attrs.get("axis", 0) % x.rank
    if idx.ndim == 0:
        return B.select(b, x, ax, int(idx))
    parts = [B.slice_(b, x, ax, int(i) % x.shape[ax], int(i) % x.shape[ax] + 1) for i in idx.ravel()]
    y = parts[0] if len(parts) == 1 else B.concat(b, parts, ax)
    return B.reshape(b, y, list(x.shape[:ax]) + list(idx.shape) + list(x.shape[ax + 1:]))


@op("Expand")
def _expand(b, node, ins, attrs, cv):
    x = ins[0]
    shape = tuple(np.broadcast_shapes(x.shape, tuple(_ints(ins[1], "Expand's shape"))))
    if shape == x.shape:
        return x
    return b.wrap(b.emit("broadcast_to", [b.plain(x)], {"shape": list(shape)}, hint="expand"))


@op("Cast")
def _cast(b, node, ins, attrs, cv):
    import onnx
    x = ins[0]
    want = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(attrs["to"])).name
    if b.g.types[x.name].dtype != want:
        raise UnsupportedError(f"Cast of a computed tensor to {want}")
    return x


@op("Pad")
def _pad(b, node, ins, attrs, cv):
    x = ins[0]
    p = _ints(ins[1], "Pad's pads")
    axes = _ints(ins[3], "Pad axes") if len(ins) > 3 and ins[3] is not None else list(range(x.rank))
    k = len(axes)
    pads = [(0, 0)] * x.rank
    for i, a in enumerate(axes):
        pads[a % x.rank] = (p[i], p[i + k])
    value = float(np.ravel(ins[2].array)[0]) if len(ins) > 2 and ins[2] is not None else 0.0
    mode = attrs.get("mode", "constant")
    if mode == "constant":
        return B.pad_const(b, x, pads, value)
    return B.pad_mode(b, x, pads, {"edge": "replicate", "wrap": "circular"}.get(mode, mode))


# ---- pooling and reductions ----------------------------------------------------------------------
@op("MaxPool", "AveragePool")
def _pool(b, node, ins, attrs, cv):
    x = ins[0]
    if len(node.output) > 1 and node.output[1]:
        raise UnsupportedError("MaxPool's Indices output")
    ks = list(attrs["kernel_shape"])
    nsp = len(ks)
    st = list(attrs.get("strides", [1] * nsp))
    dil = list(attrs.get("dilations", [1] * nsp))
    pads = _auto_pads(x, attrs, ks, st, dil)
    kind = "max" if node.op_type == "MaxPool" else "avg"
    return NN.pool(b, kind, x, ks, st, pads, bool(attrs.get("ceil_mode", 0)),
                   bool(attrs.get("count_include_pad", 0)), dil)


@op("GlobalAveragePool", "GlobalMaxPool")
def _gpool(b, node, ins, attrs, cv):
    x = ins[0]
    return NN.reduce(b, "mean" if node.op_type == "GlobalAveragePool" else "max", x, list(range(2, x.rank)), True)


@op("ReduceMean", "ReduceSum", "ReduceMax")
def _reduce(b, node, ins, attrs, cv):
    x = ins[0]
    axes = _axes(ins, attrs)
    if not axes and attrs.get("noop_with_empty_axes", 0):
        return x
    k = {"ReduceMean": "mean", "ReduceSum": "sum", "ReduceMax": "max"}[node.op_type]
    return NN.reduce(b, k, x, axes or None, bool(attrs.get("keepdims", 1)))


def _nearest_map(n_in, scale, n_out, mode, nearest_mode):
    x = np.arange(n_out, dtype=np.float64)
    if mode == "asymmetric":
        src = x / scale
    elif mode in ("half_pixel", "pytorch_half_pixel"):
        src = (x + 0.5) / scale - 0.5
    elif mode == "align_corners":
        src = x * (n_in - 1) / max(n_out - 1, 1)
    else:
        return None
    rnd = {"floor": np.floor, "ceil": np.ceil, "round_prefer_ceil": lambda v: np.floor(v + 0.5),
           "round_prefer_floor": lambda v: np.ceil(v - 0.5)}[nearest_mode]
    return np.clip(rnd(src), 0, n_in - 1).astype(np.int64)


@op("Resize", "Upsample")
def _resize(b, node, ins, attrs, cv):
    x = ins[0]
    mode = attrs.get("mode", "nearest")
    if mode != "nearest":
        raise UnsupportedError(f"Resize mode {mode!r} (Kiln imports nearest)")
    scales = ins[2] if node.op_type == "Resize" and len(ins) > 2 else (ins[1] if node.op_type == "Upsample" else None)
    sizes = ins[3] if node.op_type == "Resize" and len(ins) > 3 else None
    if sizes is not None and sizes.is_const and sizes.array.size:
        out = _ints(sizes, "Resize sizes")
        sc = [o / i for o, i in zip(out, x.shape)]
    else:
        sc = [float(s) for s in np.ravel(_const(scales, "Resize scales"))]
        out = [int(math.floor(i * s)) for i, s in zip(x.shape, sc)]
    if sc[:2] != [1.0, 1.0]:
        raise UnsupportedError(f"Resize of the batch or channel axes (scales {sc})")
    ctm = attrs.get("coordinate_transformation_mode", "half_pixel")
    nm = attrs.get("nearest_mode", "round_prefer_floor")
    for i in range(2, x.rank):
        f = out[i] // x.shape[i] if x.shape[i] else 0
        got = _nearest_map(x.shape[i], sc[i], out[i], ctm, nm)
        if f < 1 or out[i] != f * x.shape[i] or got is None or not np.array_equal(got, np.arange(out[i]) // f):
            raise UnsupportedError(f"Resize nearest with scales {sc} and coordinate_transformation_mode {ctm!r}, "
                                   f"nearest_mode {nm!r}: Kiln imports whole-number upsampling that repeats pixels")
    return NN.upsample_nearest(b, x, [o // i for o, i in zip(out[2:], x.shape[2:])])


# ---- recurrent -----------------------------------------------------------------------------------
def _gate_blocks(arr, order):
    parts = np.split(arr, len(order), axis=0)
    return np.concatenate([parts[i] for i in order], axis=0)


def _rnn_layers(ins, attrs, kind, node):
    x, w, r = ins[0], ins[1], ins[2]
    bias = ins[3] if len(ins) > 3 else None
    if len(ins) > 4 and ins[4] is not None:
        sl = ins[4]
        T = x.shape[1 if attrs.get("layout", 0) else 0]
        if not (sl.is_const and np.all(sl.array == T)):
            raise UnsupportedError(f"{kind} with sequence_lens (variable-length sequences)")
    if kind == "LSTM" and len(ins) > 7 and ins[7] is not None:
        raise UnsupportedError("LSTM with peepholes (input P)")
    if attrs.get("clip") is not None:
        raise UnsupportedError(f"{kind} with clip")
    acts = [a.decode() if isinstance(a, bytes) else a for a in attrs.get("activations", [])]
    default = ["Sigmoid", "Tanh", "Tanh"] if kind == "LSTM" else ["Sigmoid", "Tanh"]
    if acts and [a.lower() for a in acts] != [a.lower() for a in default * (len(acts) // len(default))]:
        raise UnsupportedError(f"{kind} with activations {acts}")
    if kind == "LSTM" and attrs.get("input_forget", 0):
        raise UnsupportedError("LSTM with input_forget")
    if kind == "GRU" and not attrs.get("linear_before_reset", 0):
        raise UnsupportedError("GRU with linear_before_reset=0 (PyTorch's GRU exports linear_before_reset=1)")
    order = [0, 2, 3, 1] if kind == "LSTM" else [1, 0, 2]          # to PyTorch's i,f,g,o / r,z,n
    G = len(order)
    W, R = _const(w, f"{kind} W"), _const(r, f"{kind} R")
    Bv = _const(bias, f"{kind} B") if bias is not None else None
    direction = attrs.get("direction", "forward")
    dirs = []
    for d in range(W.shape[0]):
        mk = lambda v, arr, tag: V(array=_gate_blocks(arr, order), pname=v.pname, trainable=v.trainable,
                                   view=v.view + (("onnx_gates", d, tag),))
        p = {"w_ih": mk(w, W[d], "W"), "w_hh": mk(r, R[d], "R"),
             "reverse": direction == "reverse" or d == 1}
        if Bv is not None:
            H = R.shape[-1]
            p["b_ih"] = mk(bias, Bv[d][:G * H], "Wb")
            p["b_hh"] = mk(bias, Bv[d][G * H:], "Rb")
        dirs.append(p)
    return [dirs]


@op("LSTM", "GRU")
def _rnn(b, node, ins, attrs, cv):
    kind = node.op_type
    x = ins[0]
    layout = attrs.get("layout", 0)
    h0 = ins[5] if len(ins) > 5 else None
    c0 = ins[6] if kind == "LSTM" and len(ins) > 6 else None
    if layout:
        h0 = B.permute(b, h0, (1, 0, 2)) if h0 is not None else None
        c0 = B.permute(b, c0, (1, 0, 2)) if c0 is not None else None
    layers = _rnn_layers(ins, attrs, kind, node)
    y, h_n, c_n = rnn(b, kind.lower(), x, layers, bool(layout), h0, c0)
    D = len(layers[0])
    H = layers[0][0]["w_hh"].shape[1]
    if layout:
        y = B.reshape(b, y, list(y.shape[:2]) + [D, H])                       # [N, T, D, H]
        outs = [y, B.permute(b, h_n, (1, 0, 2))] + ([B.permute(b, c_n, (1, 0, 2))] if c_n is not None else [])
    else:
        y = B.permute(b, B.reshape(b, y, list(y.shape[:2]) + [D, H]), (0, 2, 1, 3))   # [T, D, N, H]
        outs = [y, h_n] + ([c_n] if c_n is not None else [])
    return outs


# ---- QDQ (onnx_qdq) ------------------------------------------------------------------------------
@op("QuantizeLinear")
def _quantize_linear(b, node, ins, attrs, cv):
    from .onnx_qdq import act_qparams
    x = ins[0]
    if x.is_const:
        raise UnsupportedError("QuantizeLinear of a constant (quantise weights offline: int8 initializers)")
    zp = ins[2].array if len(ins) > 2 and ins[2] is not None else None
    dtype = ins[2].array.dtype.name if zp is not None else "uint8"
    cv.act_q.setdefault(x.name, act_qparams(_const(ins[1], "QuantizeLinear scale"), zp, dtype))
    return x


@op("DequantizeLinear")
def _dequantize_linear(b, node, ins, attrs, cv):
    from .onnx_qdq import dequantize_const
    from .types import QParams
    x = ins[0]
    if not x.is_const:
        return x                                 # the Q -> DQ pair of an activation: identity
    scale = _const(ins[1], "DequantizeLinear scale")
    zp = ins[2].array if len(ins) > 2 and ins[2] is not None else None
    axis = attrs.get("axis", 1)
    arr = dequantize_const(x.array, scale, zp, axis)
    name = (x.pname or "w").removesuffix("_quantized")
    if x.array.dtype == np.int8:
        if zp is not None and np.any(zp):
            raise UnsupportedError(f"int8 weights {name!r} with a non-zero zero point (Kiln's int8 weights are "
                                   f"symmetric)")
        s = np.ravel(scale).astype(np.float64)
        cv.weight_q[name] = QParams(tuple(float(np.float32(v)) for v in s), (0,) * s.size,
                                    0 if s.size > 1 else None)
    return V(array=arr, pname=name, trainable=False)
