"""matmul as TFLite's BATCH_MATMUL: int8 bit-exact with LiteRT's reference kernel (broadcast batch
dimensions, zero points, scales), float, and adj_x / adj_y import."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.frontend import TensorType, run
from kiln.frontend.tflite_import import load_tflite
from tests.frontend.tflite_builder import Builder
from tests.quantize.litert_util import assert_same, compare, litert_run, q, single_op

zp = st.integers(-128, 127)


@settings(max_examples=40, deadline=None)
@given(batch=st.sampled_from([(), (2,), (3, 2)]), bcast=st.booleans(), m=st.integers(1, 6), k=st.integers(1, 40),
       n=st.integers(1, 6), za=zp, zb=zp, zo=zp, la=st.floats(-8, 0), lb=st.floats(-8, 0), lo=st.floats(-6, 4),
       seed=st.integers(0, 2 ** 31))
def test_batch_matmul_int8_matches_litert(batch, bcast, m, k, n, za, zb, zo, la, lb, lo, seed):
    rng = np.random.default_rng(seed)
    bb = (1,) * len(batch) if bcast and batch else batch
    ta = TensorType(batch + (m, k), "int8", q(2.0 ** la, za))
    tb = TensorType(bb + (k, n), "int8", q(2.0 ** lb, zb))
    out_q = q(float(np.float32(2.0 ** (la + lb + lo) * np.sqrt(k))), zo)
    g = single_op("matmul", [("a", ta, None), ("b", tb, None)], {}, out_q)
    feeds = [rng.integers(-128, 128, ta.shape).astype(np.int8), rng.integers(-128, 128, tb.shape).astype(np.int8)]
    got, want = compare(g, feeds)
    assert_same(got, want, "batch_matmul int8")


def test_batch_matmul_float_and_adjoints():
    rng = np.random.default_rng(0)
    for adj_x, adj_y in [(False, False), (True, False), (False, True), (True, True)]:
        b = Builder()
        sa = (2, 4, 3) if adj_x else (2, 3, 4)
        sb = (1, 5, 4) if adj_y else (1, 4, 5)
        x, y = b.tensor("a", sa), b.tensor("b", sb)
        out = b.tensor("y", (2, 3, 5))
        b.op("BATCH_MATMUL", [x, y], [out], "BatchMatMulOptions", AdjX=adj_x, AdjY=adj_y)
        data = b.build([x, y], [out])
        feeds = [rng.standard_normal(sa).astype(np.float32), rng.standard_normal(sb).astype(np.float32)]
        g = load_tflite(data)
        np.testing.assert_allclose(run(g, *feeds)[0], litert_run(data, feeds)[0], rtol=1e-5, atol=1e-6)
