"""SUM (int8 and int16 requantised), REDUCE_MAX and REDUCE_MIN (int8 on the raw values) against
LiteRT's reference kernels (TensorFlow Lite Micro's interpreter for quantised SUM, where LiteRT
differs): integers bit for bit, float32 within rounding."""
import os
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kiln import tflm
from kiln.backends import compile as compile_pkg
from kiln.frontend import run
from kiln.frontend.tflite_import import TFLiteImportError, load_tflite
from tests.firmware.helpers import need_qemu

from .util import check, feed, one_op, same

SETTINGS = dict(max_examples=int(os.environ.get("KILN_PROPERTY_EXAMPLES", 40)), deadline=None,
                suppress_health_check=[HealthCheck.too_slow])
shapes = st.lists(st.integers(1, 6), min_size=1, max_size=4)


@settings(**SETTINGS)
@given(shape=shapes, op=st.sampled_from(["REDUCE_MAX", "REDUCE_MIN", "SUM"]), dtype=st.sampled_from(["int8", "float32"]),
       in_s=st.floats(1e-3, 1.0), zin=st.integers(-128, 127), zout=st.integers(-128, 127), log_ratio=st.floats(-4, 4),
       keep=st.booleans(), data=st.data(), seed=st.integers(0, 2 ** 31))
def test_reduce(shape, op, dtype, in_s, zin, zout, log_ratio, keep, data, seed):
    nd = len(shape)
    axes = data.draw(st.lists(st.integers(-nd, nd - 1), min_size=1, max_size=nd, unique_by=lambda a: a % nd))
    red = {a % nd for a in axes}
    out = [1 if i in red else n for i, n in enumerate(shape) if keep or i not in red]
    if op == "SUM" and dtype == "int8":
        return                     # test_sum_quantised_is_tflite_micros (TFLite Micro is the oracle)
    out_q = (in_s * 2.0 ** log_ratio, zout) if op == "SUM" else None
    buf = one_op(op, shape, dtype, (in_s, zin), [("axes", np.asarray(axes, np.int32))], [out], "ReducerOptions",
                 out_q=out_q, KeepDims=keep)
    check(buf, [feed(np.random.default_rng(seed), shape, dtype)], f"{op} {shape} axes {axes} keep {keep}",
          exact=dtype == "int8" or op != "SUM")


def test_reduce_max_with_other_output_quantisation_is_refused():
    buf = one_op("REDUCE_MAX", [2, 3], "int8", (0.1, 0), [("axes", np.asarray([1], np.int32))], [[2]],
                 "ReducerOptions", out_q=(0.2, 0))
    with pytest.raises(TFLiteImportError, match=r"operator 0 \(REDUCE_MAX\): the input's scale/zero point"):
        load_tflite(buf)


def _tflm(buf, x):
    """TensorFlow Lite Micro's interpreter on a one-input model."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.tflite")
        with open(path, "wb") as f:
            f.write(buf)
        return tflm.run_tflm(path, [(x,)])[0][0]


def _sum_model(shape, axes, dtype, in_q, out_q, keep=False):
    red = set(axes)
    out = [1 if i in red else n for i, n in enumerate(shape) if keep or i not in red]
    return one_op("SUM", shape, dtype, in_q, [("axes", np.asarray(axes, np.int32))], [out], "ReducerOptions",
                  out_q=out_q, KeepDims=keep)


def _ints(rng, shape, dtype):
    info = np.iinfo(dtype)
    return rng.integers(int(info.min), int(info.max) + 1, size=shape).astype(dtype)


@pytest.mark.skipif(not tflm.available(), reason="TensorFlow Lite Micro's interpreter (tflite-micro) not installed")
@settings(**SETTINGS)
@given(shape=shapes, dtype=st.sampled_from(["int8", "int16"]), in_s=st.floats(1e-3, 1.0), zin=st.integers(-128, 127),
       zout=st.integers(-128, 127), log_ratio=st.floats(-8, 4), keep=st.booleans(), data=st.data(),
       seed=st.integers(0, 2 ** 31))
def test_sum_quantised_is_tflite_micros(shape, dtype, in_s, zin, zout, log_ratio, keep, data, seed):
    """int8 and int16 SUM against TensorFlow Lite Micro's interpreter (the oracle for SUM,
    kiln/tflm.py: LiteRT's BUILTIN_REF int8 SUM is wrong for negative sums, its int16 SUM gives
    unrelated values), bit for bit, saturating sums included (a wide scale ratio range)."""
    nd = len(shape)
    axes = sorted(data.draw(st.sets(st.integers(0, nd - 1), min_size=1)))
    buf = _sum_model(shape, axes, dtype, (in_s, zin), (in_s * 2.0 ** log_ratio, zout), keep)
    x = _ints(np.random.default_rng(seed), shape, dtype)
    got, want = run(load_tflite(buf), x)[0], _tflm(buf, x)
    same(np.asarray(got), want.reshape(np.shape(got)), f"{dtype} SUM {shape} axes {axes} keep {keep}")


@pytest.mark.skipif(not tflm.available(), reason="TensorFlow Lite Micro's interpreter (tflite-micro) not installed")
@pytest.mark.parametrize("dtype, shape, axes, in_q, out_q", [
    ("int8", [1, 4, 4], [1], (0.03, -33), (0.04, -39)),          # saturates both ways (found on a user's model)
    ("int8", [2, 3, 5], [0, 2], (0.5, 7), (0.7, 100)),
    ("int16", [3, 40], [1], (0.01, 0), (0.002, 0)),
])
def test_sum_host_c_is_tflite_micros(dtype, shape, axes, in_q, out_q, tmp_path):
    """The generated C of a quantised SUM on the host against TensorFlow Lite Micro's interpreter."""
    buf = _sum_model(shape, axes, dtype, in_q, out_q)
    xs = [_ints(np.random.default_rng(s), shape, dtype) for s in range(3)]
    pkg = compile_pkg(load_tflite(buf), target="host", out_dir=tmp_path, plot=False, measure_size=False)
    for x in xs:
        got = pkg.run(x)
        got = got[0] if isinstance(got, (list, tuple)) else got
        same(np.asarray(got), _tflm(buf, x).reshape(np.shape(got)), f"host C {dtype} SUM {shape} axes {axes}")


def test_sum_int8_saturates_like_tflite_micro():
    """Hand-computed: 100 + 100 at scale ratio 1 is 200, clamped to 127 as TFLite Micro does
    (older TFLite Micro releases wrapped it to -56)."""
    buf = one_op("SUM", [2, 1], "int8", (0.5, 0), [("axes", np.asarray([0], np.int32))], [[1]], "ReducerOptions",
                 out_q=(0.5, 0))
    assert run(load_tflite(buf), np.asarray([[100], [100]], np.int8))[0].tolist() == [127]
    buf = one_op("SUM", [2, 1], "int8", (0.5, 3), [("axes", np.asarray([0], np.int32))], [[1]], "ReducerOptions",
                 out_q=(1.0, -4))
    # (-7 + 1 - 2 * 3) * 0.5 / 1.0 = -6 -> -6 - 4 = -10
    assert run(load_tflite(buf), np.asarray([[-7], [1]], np.int8))[0].tolist() == [-10]


@pytest.mark.qemu
@pytest.mark.slow
@pytest.mark.skipif(not tflm.available(), reason="TensorFlow Lite Micro's interpreter (tflite-micro) not installed")
def test_sum_on_mps2_an386_is_tflite_micros(tmp_path):
    """The quantised SUM's C kernel on the Cortex-M4 (QEMU) against TensorFlow Lite Micro's
    interpreter: int8 (saturating both ways) and int16."""
    need_qemu()
    from kiln import hil
    for k, (dtype, shape, axes, in_q, out_q) in enumerate([("int8", [1, 4, 4], [1], (0.03, -33), (0.04, -39)),
                                                            ("int16", [3, 40], [1], (0.01, 0), (0.002, 0))]):
        buf = _sum_model(shape, axes, dtype, in_q, out_q)
        path = tmp_path / f"sum{k}.tflite"
        path.write_bytes(buf)
        img, pkg = hil.build_for_board(str(path), "mps2-an386", str(tmp_path / f"b{k}"))
        samples = [_ints(np.random.default_rng(s), shape, dtype) for s in range(3)]
        res = hil.run_on_board(img, pkg, samples)
        for x, got in zip(samples, res.outputs):
            want = _tflm(buf, x)
            assert hil.same_outputs(got, want), f"mps2-an386 {dtype} SUM {shape}: {got} vs TFLite Micro {want}"
