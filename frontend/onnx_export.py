"""ONNX export (float): ``export_onnx(graph, path)`` writes a float Kiln graph as an ONNX model
(opset 17 by default, 13 to 17 accepted) that onnxruntime runs.

- Inputs and outputs keep the graph's names, shapes and layout: a Kiln-native NHWC graph gives an
  NHWC ONNX model; a model imported from NCHW PyTorch/ONNX (whose graph takes NCHW at the boundary)
  gives an NCHW ONNX model again.
- ONNX's Conv and pooling are NCHW, Kiln's NHWC. Inside, every value is tracked with the
  permutation its ONNX tensor has relative to the Kiln value; a Transpose is written only when a
  consumer needs another order, so a chain conv -> relu -> pool -> add stays NCHW and an imported
  NCHW CNN exports with no Transpose in its body. Conv weights are written OIHW.
- Parameters and constants become initializers under their Kiln names (a conv weight re-laid out
  to OIHW keeps its name), so ``kiln import`` of the exported file gives the same parameter names.
- The mapping is a table keyed by Kiln op name (``ONNX_EXPORT``); an op without an entry, or an
  int8 graph, fails naming the op and node. (It could move onto ``OpDef`` next to each op's
  ``tflite`` mapping.)

onnx is imported lazily: ``pip install 'kiln-ml[onnx]'``.
"""
from __future__ import annotations

import os

import numpy as np

from .errors import KilnError
from .files import atomic_write
from .ops._util import conv_out_and_pads
from .registry import get_op

DEFAULT_OPSET = 17
MIN_OPSET, MAX_OPSET = 13, 17
IR_VERSION = 8                # ONNX 1.10+ (opsets up to 17): runtimes older than the onnx package read it
NCHW = (0, 3, 1, 2)           # the ONNX tensor of an NHWC value x is x.transpose(NCHW)

ONNX_EXPORT: dict = {}        # Kiln op name -> fn(exporter, node)


class OnnxExportError(KilnError):
    """A graph Kiln cannot write as ONNX."""


def onnx_module():
    try:
        import onnx
    except ImportError:
        raise KilnError("exporting ONNX models needs onnx: pip install 'kiln-ml[onnx]'") from None
    return onnx


def exportable_ops() -> list[str]:
    return sorted(ONNX_EXPORT)


def export_onnx(graph, path=None, opset=DEFAULT_OPSET):
    """Write ``graph`` (float) as ONNX to ``path`` (through a .tmp file and a rename); returns the
    ``onnx.ModelProto``. ``path=None`` only builds the model."""
    model = to_onnx(graph, opset)
    if path is not None:
        atomic_write(os.fspath(path), model.SerializeToString())
    return model


def to_onnx(graph, opset=DEFAULT_OPSET):
    onnx = onnx_module()
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise OnnxExportError(f"opset {opset}: Kiln writes ONNX opsets {MIN_OPSET} to {MAX_OPSET}")
    _check_exportable(graph)
    ex = _Exporter(graph, opset)
    for node in graph.nodes:
        if ex.fold(node):
            continue
        try:
            ONNX_EXPORT[node.op](ex, node)
        except OnnxExportError as e:
            raise OnnxExportError(f"node {node.name!r} ({node.op}): {e}") from None
    outputs = []
    for o in graph.outputs:
        name = ex.output(o)
        if name != o or o in graph.inputs or o in ex.initialized:
            name = ex.add("Identity", [name], out=ex.unique(o, own=True))
        outputs.append(onnx.helper.make_tensor_value_info(name, _elem(graph.types[o].dtype),
                                                          list(graph.types[o].shape)))
    inputs = [onnx.helper.make_tensor_value_info(i, _elem(graph.types[i].dtype), list(graph.types[i].shape))
              for i in graph.inputs]
    g = onnx.helper.make_graph(ex.nodes, _ident(graph.name), inputs, outputs, ex.inits)
    model = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", opset)],
                                   producer_name="kiln", doc_string=f"exported by Kiln from graph {graph.name!r}")
    model.ir_version = IR_VERSION
    try:
        onnx.checker.check_model(model)
    except Exception as e:      # a bug of this exporter, not of the user's graph
        raise OnnxExportError(f"the exported model fails onnx.checker: {str(e).splitlines()[0]}") from None
    return model


def _check_exportable(graph):
    quant = [v for v, t in graph.types.items() if t.quant is not None]
    if quant:
        raise OnnxExportError(f"value {quant[0]!r} is quantised ({graph.types[quant[0]]}): ONNX export writes float "
                              f"graphs; export the float model (the one `kiln quantize` started from)")
    missing = sorted({n.op for n in graph.nodes} - set(ONNX_EXPORT))
    if missing:
        first = next(n for n in graph.nodes if n.op in missing)
        raise OnnxExportError(f"op {first.op!r} (node {first.name!r}) has no ONNX export mapping"
                              + (f"; also: {', '.join(m for m in missing if m != first.op)}" if len(missing) > 1
                                 else "") + f"; exportable ops: {', '.join(exportable_ops())}")


def _elem(dtype):
    onnx = onnx_module()
    return onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _ident(name):
    return "".join(c if c.isalnum() or c in "_." else "_" for c in str(name)) or "graph"


def compose(p, q):
    """The perm r with a.transpose(p).transpose(q) == a.transpose(r)."""
    return tuple(p[i] for i in q)


def inverse(p):
    out = [0] * len(p)
    for i, v in enumerate(p):
        out[v] = i
    return tuple(out)


class _Exporter:
    """ONNX nodes and initializers being written; ``env[v] = (onnx name, perm)`` means the ONNX
    tensor is the Kiln value ``v`` transposed by ``perm``."""

    def __init__(self, graph, opset):
        self.g, self.opset = graph, opset
        self.nodes, self.inits = [], []
        self.initialized = set()
        self.used = set(graph.inputs)
        self.env = {i: (i, _identity(len(graph.types[i].shape))) for i in graph.inputs}
        self.cache = {}
        self.node_names = set()
        self.folded = {}          # value -> array: nodes of constants evaluated at export

    # ---- names and values ---------------------------------------------------------------------
    def unique(self, base, own=False):
        """A fresh ONNX name: ``base`` itself when it is the Kiln value being written (``own``)
        and still free; else ``base_1``, ``base_2``, ... avoiding every Kiln name."""
        if own and base not in self.used:
            self.used.add(base)
            return base
        name, k = base, 0
        while name in self.used or name in self.g.types:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        return name

    def rank(self, v):
        return len(self.g.types[v].shape)

    def is_const(self, v):
        return v in self.g.consts or v in self.g.params or v in self.folded

    def array(self, v):
        for d in (self.folded, self.g.params, self.g.consts):
            if v in d:
                return d[v]
        raise KeyError(v)

    def fold(self, node):
        """Evaluate a node whose inputs are all constants (not parameters: those keep their names
        for fine-tuning) with Kiln's reference: BatchNorm's sqrt(var + eps) becomes one constant."""
        if not node.inputs or not all(v in self.g.consts or v in self.folded for v in node.inputs):
            return False
        op = get_op(node.op)
        if op.ref is None:
            return False
        self.folded[node.name] = np.asarray(op.ref([self.array(v) for v in node.inputs], node.attrs))
        return True

    def perm_of(self, v):
        if self.is_const(v):
            return _identity(self.rank(v))
        return self.env[v][1]

    def get(self, v, perm=None):
        """The ONNX name of Kiln value ``v`` transposed by ``perm`` (identity when None)."""
        perm = tuple(perm) if perm is not None else _identity(self.rank(v))
        key = (v, perm)
        if key in self.cache:
            return self.cache[key]
        if self.is_const(v):
            arr = np.ascontiguousarray(np.transpose(self.array(v), perm))
            name = self.initializer(arr, v)
        else:
            name, have = self.env[v]
            if have != perm:
                name = self.relayout(v, name, have, perm)
        self.cache[key] = name
        return name

    def relayout(self, v, name, have, perm, out=None):
        """ONNX tensor ``name`` (value ``v`` in layout ``have``) in layout ``perm``: a Reshape when
        only unit axes move ([N, 1, 1, C] <-> [N, C, 1, 1]), else a Transpose."""
        shape = self.g.types[v].shape
        if _moves_only_ones(shape, have, perm):
            return self.add("Reshape", [name, self.ints([shape[a] for a in perm])], out=out or self.unique(f"{v}_r"))
        return self.add("Transpose", [name], out=out or self.unique(f"{v}_t"), perm=list(compose(inverse(have), perm)))

    def initializer(self, arr, base):
        from onnx import numpy_helper
        name = self.unique(base, own=base in self.g.types)
        self.initialized.add(name)
        self.inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def const(self, arr, base):
        """An initializer for a literal the export adds (a shape, a clip bound): one per value."""
        arr = np.asarray(arr)
        key = ("literal", base, arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self.cache:
            self.cache[key] = self.initializer(arr, base)
        return self.cache[key]

    def add(self, op_type, inputs, out=None, name=None, **attrs):
        from onnx import helper
        out = out or self.unique(f"{op_type.lower()}")
        name, k = name or out, 0
        while (f"{name}_{k}" if k else name) in self.node_names:
            k += 1
        name = f"{name}_{k}" if k else name
        self.node_names.add(name)
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=name, **attrs))
        return out

    def output(self, v):
        """The ONNX name of graph output ``v`` in Kiln's layout, named ``v`` where possible."""
        if v in self.env and not self.is_const(v) and self.env[v][1] != _identity(self.rank(v)) \
                and v not in self.used:
            name, have = self.env[v]
            ident = _identity(self.rank(v))
            self.cache[(v, ident)] = self.relayout(v, name, have, ident, out=self.unique(v, own=True))
        return self.get(v)

    def set(self, v, onnx_name, perm=None):
        self.env[v] = (onnx_name, tuple(perm) if perm is not None else _identity(self.rank(v)))

    def out_name(self, node, perm=None):
        """The ONNX name of ``node``'s output: the Kiln name when in Kiln's layout."""
        if perm is None or tuple(perm) == _identity(self.rank(node.name)):
            return self.unique(node.name, own=True)
        return self.unique(f"{node.name}_nchw" if tuple(perm) == NCHW else f"{node.name}_p")

    def emit(self, node, op_type, inputs, perm=None, **attrs):
        """One ONNX node for one Kiln node, its output in layout ``perm``."""
        out = self.add(op_type, inputs, out=self.out_name(node, perm), name=node.name, **attrs)
        self.set(node.name, out, perm)
        return out

    def activation(self, node, y, perm):
        """Kiln's fused activation attribute as a following ONNX node."""
        act = node.attrs.get("activation", "none")
        if act == "none":
            self.set(node.name, y, perm)
            return
        if act == "relu":
            out = self.add("Relu", [y], out=self.out_name(node, perm), name=f"{node.name}_relu")
        else:
            lo, hi = self.scalar(0.0, node.name), self.scalar(6.0, node.name)
            out = self.add("Clip", [y, lo, hi], out=self.out_name(node, perm), name=f"{node.name}_relu6")
        self.set(node.name, out, perm)

    def scalar(self, value, v):
        return self.const(np.asarray(value, self.g.types[v].dtype), "c")

    def ints(self, values, base="shape"):
        return self.const(np.asarray(values, np.int64), base)


def _moves_only_ones(shape, have, want):
    """Whether re-laying out from ``have`` to ``want`` keeps the non-unit axes in order."""
    big = lambda perm: [a for a in perm if shape[a] != 1]
    return big(have) == big(want)


def _identity(n):
    return tuple(range(n))


def _register(*names):
    def deco(fn):
        for n in names:
            ONNX_EXPORT[n] = fn
        return fn
    return deco



# ---- the mapping: Kiln op -> ONNX ----------------------------------------------------------------
def _src(ex, v):
    """(ONNX name, perm) of ``v`` as it is at hand (constants: as stored)."""
    if ex.is_const(v):
        return ex.get(v), _identity(ex.rank(v))
    return ex.env[v]


def _axis(perm, a, rank):
    """The ONNX axis holding Kiln axis ``a`` of a value in layout ``perm``."""
    return perm.index(a % rank)


def _elementwise(op_type):
    def fn(ex, node):
        """Every operand in one layout: the first full-rank non-constant operand's. Lower-rank
        operands (a BatchNorm scale [C] against NHWC) are broadcast to full rank first:
        constants at export, values with a Reshape (plus a Transpose only when needed)."""
        r = ex.rank(node.name)
        full = [v for v in node.inputs if not ex.is_const(v) and ex.rank(v) == r]
        perm = ex.perm_of(full[0]) if full else _identity(r)
        ex.emit(node, op_type, [_broadcast(ex, v, perm, r) for v in node.inputs], perm)
    return fn


def _broadcast(ex, v, perm, r):
    if ex.rank(v) == r:
        return ex.get(v, perm)
    if perm == _identity(r):
        return ex.get(v)
    shape = (1,) * (r - ex.rank(v)) + tuple(ex.g.types[v].shape)
    if ex.is_const(v):
        return ex.const(np.ascontiguousarray(np.transpose(np.reshape(ex.array(v), shape), perm)), v)
    key = (v, "broadcast", perm)
    if key not in ex.cache:
        target = [shape[p] for p in perm]
        keeps_order = [a for a in perm if shape[a] != 1] == [a for a in range(r) if shape[a] != 1]
        y = ex.add("Reshape", [ex.get(v), ex.ints(target if keeps_order else shape)], out=ex.unique(f"{v}_b"))
        if not keeps_order:
            y = ex.add("Transpose", [y], out=ex.unique(f"{v}_bt"), perm=list(perm))
        ex.cache[key] = y
    return ex.cache[key]


for _k, _o in (("add", "Add"), ("sub", "Sub"), ("mul", "Mul"), ("div", "Div"), ("maximum", "Max"),
               ("minimum", "Min"), ("relu", "Relu"), ("sigmoid", "Sigmoid"), ("tanh", "Tanh"), ("exp", "Exp"),
               ("log", "Log"), ("sqrt", "Sqrt"), ("neg", "Neg"), ("where", "Where"), ("equal", "Equal"),
               ("greater", "Greater"), ("greater_equal", "GreaterOrEqual"), ("less", "Less"),
               ("less_equal", "LessOrEqual"), ("logical_and", "And"), ("logical_or", "Or"),
               ("logical_not", "Not")):
    ONNX_EXPORT[_k] = _elementwise(_o)


@_register("not_equal")
def _not_equal(ex, node):
    perm = ex.perm_of(node.inputs[0]) if ex.rank(node.inputs[0]) == ex.rank(node.name) else None
    perm = perm if perm is not None and all(ex.rank(v) == ex.rank(node.name) for v in node.inputs) else None
    eq = ex.add("Equal", [ex.get(v, perm) for v in node.inputs], name=f"{node.name}_eq")
    ex.emit(node, "Not", [eq], perm)


@_register("relu6")
def _relu6(ex, node):
    name, perm = _src(ex, node.inputs[0])
    ex.emit(node, "Clip", [name, ex.scalar(0.0, node.name), ex.scalar(6.0, node.name)], perm)


@_register("pow")
def _pow(ex, node):
    name, perm = _src(ex, node.inputs[0])
    ex.emit(node, "Pow", [name, ex.scalar(node.attrs["exponent"], node.name)], perm)


@_register("cast")
def _cast(ex, node):
    name, perm = _src(ex, node.inputs[0])
    ex.emit(node, "Cast", [name], perm, to=_elem(node.attrs["dtype"]))


# ---- linear layers -------------------------------------------------------------------------------
def _conv_pads(x_shape, k, stride, dilation, padding):
    """ONNX pads [top, left, bottom, right] of Kiln's 'valid' / 'same' / [t, b, l, r] padding."""
    _, t, b = conv_out_and_pads(x_shape[1], k[0], stride[0], dilation[0], padding, 0)
    _, le, r = conv_out_and_pads(x_shape[2], k[1], stride[1], dilation[1], padding, 1)
    return [t, le, b, r]


@_register("conv2d")
def _conv2d(ex, node):
    x, w = node.inputs[:2]
    a = node.attrs
    wshape = ex.g.types[w].shape
    ins = [ex.get(x, NCHW), ex.get(w, NCHW)] + [ex.get(b) for b in node.inputs[2:]]
    pads = _conv_pads(ex.g.types[x].shape, wshape[1:3], a["stride"], a["dilation"], a["padding"])
    act = a.get("activation", "none")
    out = ex.add("Conv", ins, out=ex.out_name(node, NCHW) if act == "none" else ex.unique(f"{node.name}_conv"),
                 name=node.name, kernel_shape=list(wshape[1:3]), strides=list(a["stride"]),
                 dilations=list(a["dilation"]), pads=pads, group=a["groups"])
    ex.activation(node, out, NCHW)


@_register("dense")
def _dense(ex, node):
    x, w = node.inputs[:2]
    act = node.attrs.get("activation", "none")
    out = ex.out_name(node) if act == "none" else ex.unique(f"{node.name}_linear")
    if ex.rank(x) == 2:
        ins = [ex.get(x), ex.get(w)] + [ex.get(b) for b in node.inputs[2:]]
        y = ex.add("Gemm", ins, out=out, name=node.name, transB=1)
    else:
        y = ex.add("MatMul", [ex.get(x), ex.get(w, (1, 0))], out=out if len(node.inputs) == 2 else None,
                   name=node.name)
        if len(node.inputs) == 3:
            y = ex.add("Add", [y, ex.get(node.inputs[2])], out=out, name=f"{node.name}_bias")
    ex.activation(node, y, None)


@_register("matmul")
def _matmul(ex, node):
    ex.emit(node, "MatMul", [ex.get(v) for v in node.inputs])


def _pool(op_type):
    def fn(ex, node):
        x = node.inputs[0]
        a = node.attrs
        stride = a["stride"] or a["pool"]
        extra = {"count_include_pad": int(a["count_include_pad"])} if op_type == "AveragePool" else {}
        ex.emit(node, op_type, [ex.get(x, NCHW)], NCHW, kernel_shape=list(a["pool"]), strides=list(stride),
                pads=_conv_pads(ex.g.types[x].shape, a["pool"], stride, [1, 1], a["padding"]), **extra)
    return fn


ONNX_EXPORT["max_pool2d"] = _pool("MaxPool")
ONNX_EXPORT["avg_pool2d"] = _pool("AveragePool")


# ---- reductions and softmax ----------------------------------------------------------------------
def _reduce(op_type, axes_input_from):
    def fn(ex, node):
        x = node.inputs[0]
        name, perm = _src(ex, x)
        r = ex.rank(x)
        axes = sorted(range(r) if node.attrs["axes"] is None else [a % r for a in node.attrs["axes"]])
        keep = bool(node.attrs["keepdims"])
        oaxes = sorted(_axis(perm, a, r) for a in axes)
        if keep:
            out_perm = perm
        else:
            kept = [perm[j] for j in range(r) if perm[j] not in axes]
            rank_of = {a: i for i, a in enumerate(sorted(kept))}
            out_perm = tuple(rank_of[a] for a in kept)
        if ex.opset >= axes_input_from:
            ex.emit(node, op_type, [name, ex.ints(oaxes, "axes")], out_perm, keepdims=int(keep))
        else:
            ex.emit(node, op_type, [name], out_perm, axes=oaxes, keepdims=int(keep))
    return fn


ONNX_EXPORT["mean"] = _reduce("ReduceMean", 18)
ONNX_EXPORT["sum"] = _reduce("ReduceSum", 13)
ONNX_EXPORT["max"] = _reduce("ReduceMax", 18)


def _softmax(op_type):
    def fn(ex, node):
        name, perm = _src(ex, node.inputs[0])
        ex.emit(node, op_type, [name], perm, axis=_axis(perm, node.attrs["axis"], ex.rank(node.name)))
    return fn


ONNX_EXPORT["softmax"] = _softmax("Softmax")
ONNX_EXPORT["log_softmax"] = _softmax("LogSoftmax")


# ---- data movement -------------------------------------------------------------------------------
@_register("transpose")
def _transpose(ex, node):
    """No node: the permutation is recorded and applied when a consumer needs it."""
    name, have = _src(ex, node.inputs[0])
    r = ex.rank(node.name)
    perm = tuple(node.attrs["perm"]) if node.attrs["perm"] is not None else tuple(reversed(range(r)))
    ex.set(node.name, name, compose(inverse(perm), have))


@_register("reshape")
def _reshape(ex, node):
    """A reshape that only adds or drops unit axes keeps the input's layout (a Conv1d's
    [N, L, C] <-> [N, L, 1, C] stays NCL <-> NCHW); any other reads the input in Kiln's layout."""
    x = node.inputs[0]
    shape = ex.g.types[node.name].shape
    perm = None if ex.is_const(x) else _unit_reshape_layout(ex.g.types[x].shape, ex.env[x][1], shape)
    if perm is None:
        ex.emit(node, "Reshape", [ex.get(x), ex.ints(shape)])
    else:
        ex.emit(node, "Reshape", [ex.env[x][0], ex.ints([shape[a] for a in perm])], perm)


def _unit_reshape_layout(xs, have, ys):
    """The layout of the reshape of ``xs`` (held in layout ``have``) to ``ys`` that is a plain
    ONNX Reshape of the held tensor, when the reshape only adds or drops unit axes; else None."""
    xbig, ybig = [a for a in range(len(xs)) if xs[a] != 1], [a for a in range(len(ys)) if ys[a] != 1]
    if [xs[a] for a in xbig] != [ys[a] for a in ybig] or have == _identity(len(xs)):
        return None
    to_y = dict(zip(xbig, ybig))
    order = [to_y[a] for a in have if a in to_y]          # the non-unit axes as the held tensor has them
    made = list(order)
    for u in (a for a in range(len(ys)) if ys[a] == 1):
        made.insert(min(u, len(made)), u)
    for cand in ([NCHW] if len(ys) == 4 else []) + [_identity(len(ys)), tuple(made)]:
        if [a for a in cand if ys[a] != 1] == order:
            return tuple(cand)
    return None


@_register("broadcast_to")
def _broadcast_to(ex, node):
    ex.emit(node, "Expand", [ex.get(node.inputs[0]), ex.ints(ex.g.types[node.name].shape)])


@_register("concat")
def _concat(ex, node):
    r = ex.rank(node.name)
    perms = {ex.perm_of(v) for v in node.inputs if not ex.is_const(v)}
    perm = perms.pop() if len(perms) == 1 else _identity(r)
    ex.emit(node, "Concat", [ex.get(v, perm) for v in node.inputs], perm, axis=_axis(perm, node.attrs["axis"], r))


@_register("pad")
def _pad(ex, node):
    name, perm = _src(ex, node.inputs[0])
    p = node.attrs["pads"]
    lo = [p[2 * perm[j]] for j in range(len(perm))]
    hi = [p[2 * perm[j] + 1] for j in range(len(perm))]
    ex.emit(node, "Pad", [name, ex.ints(lo + hi, "pads"), ex.scalar(node.attrs["value"], node.name)], perm,
            mode="constant")


@_register("slice")
def _slice(ex, node):
    name, perm = _src(ex, node.inputs[0])
    a = node.attrs
    r = ex.rank(node.name)
    steps = a["strides"] or [1] * len(a["begin"])
    axes = [_axis(perm, i, r) for i in range(len(a["begin"]))]
    ex.emit(node, "Slice", [name, ex.ints(a["begin"], "starts"), ex.ints(a["end"], "ends"), ex.ints(axes, "axes"),
                            ex.ints(steps, "steps")], perm)
