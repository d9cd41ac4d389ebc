"""ONNX import: ``load_onnx(path)`` -> a Kiln Graph (opsets 13 to the newest the installed ``onnx``
knows).

- ``onnx.checker`` runs first; a model it rejects is refused with its message.
- Float initializers become Kiln parameters under their ONNX names (trainable: fine-tuning and QAT
  work), BatchNormalization's mean/var become constants; ``Constant`` nodes and every node whose
  inputs are all constants (shape arithmetic: Shape, Gather, Concat, Cast, ...) are evaluated at
  import with ``onnx.reference``.
- Each ONNX op maps onto Kiln ops through the table in ``onnx_ops`` (many-to-many, as for ATen);
  QuantizeLinear/DequantizeLinear pairs become Kiln int8 (``onnx_qdq``).
- Inputs keep their ONNX shapes and layout (NCHW stays NCHW at the boundary; inside, NHWC, see
  import_layout). A symbolic dimension (a dynamic batch) is imported as 1 unless
  ``input_shapes`` gives it.
- An unsupported op fails naming the op type, the node name and the opset.

onnx is imported lazily: ``pip install 'kiln-ml[onnx]'``.
"""
from __future__ import annotations

import os

import numpy as np

from .errors import KilnError
from .import_blocks import UnsupportedError
from .import_layout import Builder, ImportError_, V

MIN_OPSET = 13


class OnnxImportError(ImportError_):
    """An ONNX model Kiln cannot read or import."""


def onnx_module():
    try:
        import onnx
    except ImportError:
        raise KilnError("importing ONNX models needs onnx: pip install 'kiln-ml[onnx]'") from None
    return onnx


def load_onnx(path, input_shapes=None):
    onnx = onnx_module()
    path = os.fspath(path)
    try:
        model = onnx.load(path)
    except Exception as e:
        raise OnnxImportError(f"{path}: not a readable ONNX model ({type(e).__name__}: {e})") from None
    return from_onnx(model, os.path.splitext(os.path.basename(path))[0], input_shapes, where=path)


def opset_of(model):
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


def from_onnx(model, name="model", input_shapes=None, where="model"):
    onnx = onnx_module()
    try:
        onnx.checker.check_model(model)
    except Exception as e:
        raise OnnxImportError(f"{where}: onnx.checker rejects the model: {str(e).strip().splitlines()[0]}") from None
    opset = opset_of(model)
    newest = onnx.defs.onnx_opset_version()
    if opset is None or not MIN_OPSET <= opset <= newest:
        raise OnnxImportError(f"{where}: opset {opset}: Kiln imports ONNX opsets {MIN_OPSET} to {newest} (convert "
                              f"with onnx.version_converter.convert_version(model, {MIN_OPSET}))")
    other = [o.domain for o in model.opset_import if o.domain not in ("", "ai.onnx")]
    from . import onnx_ops
    return _Converter(model.graph, name, opset, onnx_ops, input_shapes or {}, other).run()


class _Converter:
    def __init__(self, graph, name, opset, table, input_shapes, domains):
        self.graph, self.opset, self.table = graph, opset, table
        self.b = Builder(name)
        self.env = {}
        self.input_shapes = input_shapes
        self.domains = domains
        self.act_q, self.weight_q = {}, {}        # QDQ models: see onnx_qdq

    def run(self):
        onnx = onnx_module()
        from onnx import numpy_helper
        b, g = self.b, self.graph
        self.env[""] = None
        for init in g.initializer:
            arr = numpy_helper.to_array(init)
            self.env[init.name] = V(array=arr, pname=init.name,
                                    trainable=arr.dtype.kind == "f" and arr.ndim >= 1)
        for inp in g.input:
            if inp.name in self.env:
                continue
            self.env[inp.name] = b.input(_ident(inp.name), self._shape(inp), _dtype(onnx, inp.type.tensor_type.elem_type))
        bad = self._unsupported()
        if bad:
            n = bad[0]
            more = sorted({m.op_type for m in bad[1:]} - {n.op_type})
            raise UnsupportedError(f"unsupported ONNX op {n.op_type}" + (f" (domain {n.domain})" if n.domain else "")
                                   + f" at node {n.name!r}, opset {self.opset}"
                                   + (f"; also unsupported: {', '.join(more)}" if more else "")
                                   + "; docs/import.md lists the supported ops")
        for node in g.node:
            self.node(node)
        outs = [self.env[o.name] for o in g.output]
        b.meta.update(source="onnx", onnx_opset=self.opset,
                      source_inputs=[i.name for i in g.input if i.name not in {t.name for t in g.initializer}])
        graph = b.finish(outs, [o.name for o in g.output])
        if not self.act_q:
            return graph
        from .onnx_qdq import to_int8
        return to_int8(graph, self.act_q, self.weight_q, {k: v for k, v in b._params.items()})

    def _unsupported(self):
        """Nodes neither in the table nor evaluable at import (every input a constant)."""
        const = {k for k, v in self.env.items() if v is None or (v.is_const and not v.trainable)}
        bad = []
        for n in self.graph.node:
            if n.op_type not in self.table.NO_FOLD and (
                    n.op_type in ("Shape", "Size") or all(i in const or not i for i in n.input)):
                const.update(n.output)
                continue
            if n.op_type not in self.table.ONNX or n.domain not in ("", "ai.onnx"):
                bad.append(n)
        return bad

    def _shape(self, inp):
        given = self.input_shapes.get(inp.name)
        if given is not None:
            return [int(s) for s in given]
        dims = inp.type.tensor_type.shape.dim
        return [d.dim_value if d.HasField("dim_value") else 1 for d in dims]

    def node(self, node):
        onnx = onnx_module()
        ins = [self.env.get(i) if i else None for i in node.input]
        for i, v in zip(node.input, ins):
            if i and v is None and i not in self.env:
                raise OnnxImportError(f"node {node.name!r} ({node.op_type}): input {i!r} is not defined before it")
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in attrs.items()}
        self.b.hint = _ident(node.name or node.op_type)
        try:
            if self._foldable(node, ins):
                outs = self.fold(node, ins)
            else:
                outs = self.table.ONNX[node.op_type](self.b, node, ins, attrs, self)
        except ImportError_ as e:
            raise type(e)(f"ONNX {node.op_type} node {node.name!r} (opset {self.opset}): {e}") from None
        outs = outs if isinstance(outs, (tuple, list)) else [outs]
        for name, v in zip(node.output, outs):
            if name:
                self.env[name] = v

    def _foldable(self, node, ins):
        if node.op_type in self.table.NO_FOLD:
            return False
        return all(v is None or (v.is_const and not v.trainable) for v in ins) or node.op_type in ("Shape", "Size")

    def fold(self, node, ins):
        """Evaluate a node of constants with onnx.reference (Shape/Size read static shapes)."""
        from onnx.reference import ReferenceEvaluator
        if node.op_type in ("Shape", "Size"):
            return self.table.static_shape(self.b, node, ins[0], node.op_type)
        feeds = {i: v.array for i, v in zip(node.input, ins) if i}
        try:
            res = ReferenceEvaluator(node).run(None, feeds)
        except Exception as e:
            raise OnnxImportError(f"evaluating constant node failed: {type(e).__name__}: {e}") from None
        return [self.b.const(np.asarray(r)) for r in res]


def _ident(name):
    out = "".join(c if c.isalnum() or c in "_." else "_" for c in name).strip("_.")
    return out or "v"


def _dtype(onnx, elem):
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)).name
