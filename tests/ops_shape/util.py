"""Single-operator .tflite models for the data-movement and reduction ops, run in LiteRT's
reference kernels (BUILTIN_REF, the oracle) and in Kiln (import + reference), compared element
for element; the imported graph is exported again and re-imported (round trip)."""
from __future__ import annotations

import numpy as np
import pytest

from kiln.frontend import run
from kiln.frontend.tflite_import import load_tflite
from kiln.quantize.tflite_export import export_tflite
from tests.frontend.tflite_builder import Builder


def litert_all(model: bytes, inputs):
    interp = pytest.importorskip("ai_edge_litert.interpreter")
    it = interp.Interpreter(model_content=model, experimental_op_resolver_type=interp.OpResolverType.BUILTIN_REF)
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


def same(got, want, what, exact=True):
    assert got.shape == want.shape, f"{what}: shape {got.shape} vs LiteRT {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} vs LiteRT {want.dtype}"
    if exact:
        bad = np.argwhere(got != want)
        assert len(bad) == 0, (f"{what}: {len(bad)} of {got.size} elements differ from LiteRT, e.g. at "
                               f"{bad[0].tolist()}: kiln {got[tuple(bad[0])]} vs litert {want[tuple(bad[0])]}")
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=what)


def check(buf, feeds, what, exact=True, round_trip=True):
    """LiteRT vs Kiln on ``buf``; then export -> import and the same results again. Returns the graph."""
    want = litert_all(buf, feeds)
    g = load_tflite(buf)
    got = run(g, *feeds)
    assert len(got) == len(want), what
    for k, (a, b) in enumerate(zip(got, want)):
        same(np.asarray(a), b, f"{what} output {k}", exact)
    if not round_trip:
        return g
    g2 = load_tflite(export_tflite(g))
    for k, (a, b) in enumerate(zip(run(g2, *feeds), got)):
        same(np.asarray(a), np.asarray(b), f"{what} output {k} after export -> import", True)
    return g


def one_op(opname, x_shape, dtype, qp, consts, out_shapes, options=None, out_q=None, inputs_first=True,
           n_inputs=1, version_of_int8=None, **fields):
    """A model with ``n_inputs`` activation inputs of ``x_shape`` (quantised ``qp`` = (scale, zp)
    when int8 or int16), constant inputs ``consts`` [(name, array)] and outputs of ``out_shapes``; the op
    version is the int8 one for int8 (or always, ``version_of_int8=True``)."""
    b = Builder(opname.lower())
    quantised = dtype in ("int8", "int16")
    sc, zp = qp if quantised else (None, 0)
    xs = [b.tensor(f"x{j}", x_shape, dtype, scale=sc, zero_point=zp) for j in range(n_inputs)]
    cs = [b.tensor(n, np.asarray(v).shape, str(np.asarray(v).dtype), data=v) for n, v in consts]
    osc, ozp = (out_q or qp) if quantised else (None, 0)
    ys = [b.tensor(f"y{j}", s, dtype, scale=osc, zero_point=ozp) for j, s in enumerate(out_shapes)]
    int8 = dtype == "int8" if version_of_int8 is None else version_of_int8
    b.op(opname, xs + cs if inputs_first else cs + xs, ys, options, int8, **fields)
    return b.build(xs, ys)


def feed(rng, shape, dtype):
    if dtype == "int8":
        return rng.integers(-128, 128, size=shape).astype(np.int8)
    return rng.standard_normal(shape).astype(np.float32)
