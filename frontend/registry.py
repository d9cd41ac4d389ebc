"""The op registry: one entry per op.

An :class:`OpDef` holds everything Kiln knows about one op: its attribute schema, shape/dtype
rule, NumPy float reference and VJP (filled in ``frontend/ops``), and the rules other folders own
(``int8_ref`` from ``quantize/``, ``lower`` from ``backends/``: a backend's overrides). ``te`` is
the op's one float lowering, a TVM TE compute shared by every backend (the backends import TVM
and pass the helper module ``frontend/ops/te_helpers.py`` in as ``T``), ``macs`` its multiply-accumulate
count. A missing rule raises a ``NotImplementedError`` naming the rule and the op, never a bare
``KeyError``.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from .errors import GraphError

# property sets (tinygrad-style): what kind of op this is
ELEMENTWISE = "elementwise"   # output[i] depends on input[i] only (after broadcasting)
UNARY = "unary"
BINARY = "binary"
LINEAR = "linear"             # conv / dense / matmul: has MACs
REDUCTION = "reduction"
SHAPE = "shape"               # data movement only
QUANTIZABLE = "quantizable"   # has an int8 reference
NONDIFF = "nondiff"           # output is not differentiable (comparisons, casts to int)
INT16 = "int16"               # its int8 reference also runs TFLite's 16x8 kernel (int16 activations)


@dataclasses.dataclass(frozen=True)
class Attr:
    """Schema of one attribute: type name ('int', 'float', 'bool', 'str', 'ints', 'any'),
    default (``REQUIRED`` when the attribute must be given) and allowed values."""
    type: str
    default: Any = None
    choices: tuple | None = None


REQUIRED = object()
_CHECK = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "ints": lambda v: isinstance(v, (list, tuple)) and all(isinstance(x, int) for x in v),
    "any": lambda v: True,
}


@dataclasses.dataclass(frozen=True)
class Quant:
    """How post-training quantisation treats an op (TFLite's int8 specification).

    ``output``: "calibrated" (the output's own calibrated range), "input" (input 0's quantisation:
    pooling, reshape, pad), or "fixed" (``fixed`` = (scale, zero_point): softmax, logistic, tanh).
    ``inputs``: "operands" (every input int8 as it comes), "weights" (inputs 1 and 2 are the weights,
    quantised symmetric per channel or per tensor, and the int32 bias: conv2d, dense), or
    "requantize" (every input requantised to the output's parameters: concat)."""
    output: str = "calibrated"
    fixed: tuple | None = None
    inputs: str = "operands"
    # ops whose operands each need their own treatment (lstm: int8 weights, int32 biases, int16
    # cell state): ``convert(conv, node, dtype) -> (quantised input names, output QParams)`` with
    # the converter ``conv`` (frontend/int8_convert.py), and ``observe(input arrays, attrs) ->
    # {tag: array}``: internal values calibration records as ranges["<node>:<tag>"]
    convert: Callable | None = None
    observe: Callable | None = None


@dataclasses.dataclass(frozen=True)
class TFLiteExport:
    """How the .tflite exporter writes an op: ``fn(e, node, act, out, int8)`` adds the TFLite
    operator(s) through the exporter ``e`` (quantize/tflite_export.py). ``versions``: the op
    version LiteRT needs per builtin when the tensors are int8 (float uses version 1).
    ``fuses_activation``: a following clamp-only relu/relu6 folds into the op's
    fused_activation_function (``act``)."""
    fn: Callable
    versions: dict = dataclasses.field(default_factory=dict)
    fuses_activation: bool = False


WEIGHTS = Quant(inputs="weights")          # conv2d, dense
SAME_AS_INPUT = Quant(output="input")      # pooling, reshape, pad: the input's quantisation


@dataclasses.dataclass
class OpDef:
    name: str
    attrs: dict = dataclasses.field(default_factory=dict)
    infer: Callable | None = None       # (in_types, attrs) -> TensorType
    ref: Callable | None = None         # (arrays, attrs) -> ndarray           float reference
    vjp: Callable | None = None         # (node, xs, y, gy) -> [grad Tensor | None]  builds nodes
    int8_ref: Callable | None = None    # (arrays, attrs, in_types, out_type) -> ndarray
    lower: dict = dataclasses.field(default_factory=dict)   # backend name -> lowering rule
    props: frozenset = frozenset()
    arity: int | None = None            # number of inputs (None: variadic)
    doc: str = ""
    quant: Quant | None = None          # how PTQ quantises it (None: no int8 form)
    tflite: TFLiteExport | None = None  # how the .tflite exporter writes it (None: not exportable)
    te: Callable | None = None          # (T, xs, attrs, out_type) -> te.Tensor  float lowering (TE)
    macs: Callable | None = None        # (in_types, out_type, attrs) -> int      MACs of one node

    def rule(self, name):
        fn = getattr(self, name)
        if fn is None:
            raise NotImplementedError(f"{_RULE_NAMES.get(name, name)} for '{self.name}' not implemented")
        return fn

    def normalize_attrs(self, attrs, where=""):
        """Fill defaults, reject unknown or ill-typed attributes. Returns a new dict."""
        out = {}
        attrs = dict(attrs or {})
        for k in attrs:
            if k not in self.attrs:
                raise GraphError(f"{where}op '{self.name}' has no attribute {k!r}; "
                                 f"known: {sorted(self.attrs)}")
        for k, spec in self.attrs.items():
            if k in attrs:
                v = attrs[k]
                if isinstance(v, tuple):
                    v = list(v)
                if v is not None and not _CHECK[spec.type](v):
                    raise GraphError(f"{where}attribute {k!r} of '{self.name}' must be {spec.type}, got {v!r}")
                if spec.choices is not None and v not in spec.choices:
                    raise GraphError(f"{where}attribute {k!r} of '{self.name}' must be one of "
                                     f"{spec.choices}, got {v!r}")
                out[k] = v
            elif spec.default is REQUIRED:
                raise GraphError(f"{where}op '{self.name}' needs attribute {k!r}")
            else:
                out[k] = list(spec.default) if isinstance(spec.default, tuple) else spec.default
        return out


_RULE_NAMES = {"infer": "shape rule", "ref": "NumPy reference", "vjp": "VJP",
               "int8_ref": "int8 reference", "te": "TE lowering", "macs": "MAC count"}

OPS: dict[str, OpDef] = {}
# TFLite builtin op name -> import converter, filled next to each op's definition
# (frontend/ops/tflite_util.importer); the importer's list of supported ops is its keys
TFLITE_IMPORTERS: dict = {}


def register(name, *, attrs=None, infer=None, ref=None, vjp=None, props=(), arity=None, doc="", quant=None):
    if name in OPS:
        raise GraphError(f"op '{name}' registered twice")
    op = OpDef(name, dict(attrs or {}), infer, ref, vjp, props=frozenset(props), arity=arity, doc=doc, quant=quant)
    OPS[name] = op
    return op


def quantizable_ops() -> list[str]:
    """The ops post-training quantisation can convert (they have a Quant rule)."""
    return sorted(n for n, op in OPS.items() if op.quant is not None)


def tflite_int8_versions() -> dict[str, int]:
    """Builtin name -> the op version LiteRT needs when the op has int8 tensors (from every
    op's export mapping; float ops are written as version 1)."""
    out = {}
    for op in OPS.values():
        if op.tflite is not None:
            for k, v in op.tflite.versions.items():
                out[k] = max(out.get(k, 1), v)
    return out


def get_op(name) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        raise GraphError(f"unknown op '{name}'; registered ops: {', '.join(sorted(OPS))}") from None


def defrule(op_name, rule):
    """Decorator that fills one rule of a registered op: ``@defrule('conv2d', 'vjp')``."""
    def deco(fn):
        setattr(get_op(op_name), rule, fn)
        return fn
    return deco


def mark(prop, *names):
    """Add ``prop`` to the named ops (a family module's ``# ---- int16 ----`` block marks the ops
    whose int8 reference it extends with ``INT16``)."""
    for name in names:
        op = get_op(name)
        op.props = op.props | {prop}


def deflower(op_name, backend):
    """Decorator used by backends/: ``@deflower('conv2d', 'c')``."""
    def deco(fn):
        get_op(op_name).lower[backend] = fn
        return fn
    return deco
