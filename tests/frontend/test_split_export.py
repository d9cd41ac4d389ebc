"""Equal slices of one axis export as one SPLIT (frontend/ops/split_export.py): float and int8
against LiteRT's reference kernels, the import round trip, and the slices that must stay
STRIDED_SLICEs (unequal, overlapping, strided, not covering the axis, or only one part)."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.frontend import Graph, TensorType, run
from kiln.frontend.tflite_import import load_tflite
from kiln.quantize.tflite_export import export_tflite
from tests.frontend.test_gru_export import ops_of
from tests.quantize.litert_util import assert_same, litert_run, q


def _graph(shape, axis, cuts, int8, strides=None):
    g = Graph("split")
    g.add_input("x", TensorType(shape, "int8" if int8 else "float32", q(0.05, 3) if int8 else None))
    outs = []
    for k, (b, e) in enumerate(cuts):
        begin, end = [0] * len(shape), list(shape)
        begin[axis], end[axis] = b, e
        outs.append(g.add_node("slice", ["x"], {"begin": begin, "end": end, "strides": strides}, name=f"p{k}"))
    g.outputs = outs[::-1]                      # outputs in another order than the parts
    return g


def _feed(shape, int8, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(-128, 128, shape).astype(np.int8) if int8 else rng.standard_normal(shape).astype(np.float32)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.integers(0, 3), st.integers(2, 4), st.booleans(),
       st.integers(0, 10**6))
def test_equal_parts_export_as_one_split(dims, axis, parts, int8, seed):
    axis %= len(dims)
    shape = list(dims)
    shape[axis] *= parts
    size = shape[axis] // parts
    g = _graph(tuple(shape), axis, [(k * size, (k + 1) * size) for k in range(parts)], int8)
    model = export_tflite(g)
    assert ops_of(model) == ["SPLIT"]
    x = _feed(tuple(shape), int8, seed)
    want = litert_run(model, [x])
    for got, w, back in zip(run(g, x), want, run(load_tflite(model), x)):
        assert_same(got, w, "reference")
        assert_same(back, w, "re-imported")


def test_other_slices_stay_strided_slices():
    x = _feed((2, 6), False, 0)
    for cuts, strides in (([(0, 2), (2, 6)], None), ([(0, 3), (2, 5)], None), ([(0, 3)], None),
                          ([(0, 2), (2, 4)], None), ([(0, 3), (3, 6)], [1, 2])):
        g = _graph((2, 6), 1, cuts, False, strides)
        model = export_tflite(g)
        assert set(ops_of(model)) == {"STRIDED_SLICE"}, (cuts, strides)
        for got, want in zip(run(g, x), litert_run(model, [x])):
            np.testing.assert_array_equal(got, want)
