"""Helpers for comparing Kiln's int8 reference with LiteRT's reference kernels."""
import os
import tempfile

import numpy as np
import pytest

from kiln.frontend import Graph, QParams, TensorType, get_op, run
from kiln.quantize.tflite_export import export_tflite


def litert_run(model: bytes, inputs):
    interp = pytest.importorskip("ai_edge_litert.interpreter")
    it = interp.Interpreter(model_content=model, experimental_op_resolver_type=interp.OpResolverType.BUILTIN_REF)
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


def q(scale, zp=0, axis=None):
    if axis is None:
        return QParams((float(np.float32(scale)),), (int(zp),))
    return QParams(tuple(float(s) for s in np.asarray(scale, np.float32)), tuple(int(z) for z in np.atleast_1d(zp)), axis)


def single_op(op, inputs, attrs, out_quant, out_dtype="int8", out_shape=None):
    """Graph with one node ``op``; inputs are (name, TensorType, const data or None)."""
    g = Graph(op)
    names = []
    for name, t, data in inputs:
        if data is None:
            g.add_input(name, t)
        else:
            g.add_const(name, np.asarray(data, t.dtype), t.quant)
        names.append(name)
    opdef = get_op(op)
    a = opdef.normalize_attrs(attrs)
    if out_shape is None:
        try:
            out_shape = opdef.infer([g.types[n] for n in names], a).shape
        except Exception:
            out_shape = g.types[names[0]].shape
    g.add_node(op, names, a, name="y", out_type=TensorType(out_shape, out_dtype, out_quant))
    g.outputs = ["y"]
    return g


def tflm_run(model: bytes, inputs):
    """TensorFlow Lite Micro's interpreter (kiln/tflm.py) on one sample of a model given as bytes."""
    pytest.importorskip("tflite_micro.python.tflite_micro.runtime")
    from kiln import tflm
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.tflite")
        with open(path, "wb") as f:
            f.write(model)
        return list(tflm.run_tflm(path, [tuple(inputs)])[0])


def compare(g, feeds, oracle="litert"):
    """Run g in Kiln and (exported) in LiteRT's reference kernels, or in TensorFlow Lite Micro's
    interpreter (``oracle="tflm"``, for the ops where the two differ); return (kiln, oracle)
    outputs."""
    data = export_tflite(g)
    want = (tflm_run if oracle == "tflm" else litert_run)(data, feeds)[0]
    got = run(g, *feeds)[0]
    return got, want.reshape(got.shape) if oracle == "tflm" else want


def assert_same(got, want, what=""):
    assert got.shape == want.shape, f"{what}: shape {got.shape} vs LiteRT {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} vs LiteRT {want.dtype}"
    bad = np.argwhere(got != want)
    assert len(bad) == 0, (f"{what}: {len(bad)} of {got.size} elements differ from LiteRT, e.g. at {bad[0].tolist()}: "
                           f"kiln {got[tuple(bad[0])]} vs litert {want[tuple(bad[0])]}")
