"""TRANSPOSE_CONV (float) as conv2d_grad_input: LiteRT's reference kernel on hand-built models
(SAME/VALID, strides, bias, fused activations) and Kiln's exporter round trip."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.frontend import run
from kiln.frontend.errors import KilnError
from kiln.frontend.ops.nn import conv_geometry
from kiln.frontend.tflite_import import load_tflite
from kiln.quantize.tflite_export import export_tflite
from tests.frontend.tflite_builder import Builder
from tests.quantize.litert_util import litert_run


def _model(rng, oh, ow, cin, cout, kh, kw, s, pad, bias, act):
    G = conv_geometry((1, oh, ow, cout), (cin, kh, kw, cout), dict(stride=[s, s], padding=pad, dilation=[1, 1],
                                                                    groups=1))
    b = Builder()
    osh = b.tensor("output_shape", (4,), "int32", data=[1, oh, ow, cout])
    w = b.tensor("w", (cout, kh, kw, cin), data=rng.standard_normal((cout, kh, kw, cin)))
    x = b.tensor("x", (1, G["oh"], G["ow"], cin))
    ins = [osh, w, x]
    if bias:
        ins.append(b.tensor("b", (cout,), data=rng.standard_normal(cout)))
    y = b.tensor("y", (1, oh, ow, cout))
    b.op("TRANSPOSE_CONV", ins, [y], "TransposeConvOptions", Padding=0 if pad == "same" else 1, StrideW=s,
         StrideH=s, FusedActivationFunction=act)
    return b.build([x], [y]), (1, G["oh"], G["ow"], cin)


@settings(max_examples=30, deadline=None)
@given(oh=st.integers(2, 9), ow=st.integers(2, 9), cin=st.integers(1, 3), cout=st.integers(1, 3),
       kh=st.integers(1, 3), kw=st.integers(1, 3), s=st.integers(1, 3), pad=st.sampled_from(["same", "valid"]),
       bias=st.booleans(), act=st.sampled_from([0, 1, 3]), seed=st.integers(0, 2 ** 31))
def test_transpose_conv_matches_litert(oh, ow, cin, cout, kh, kw, s, pad, bias, act, seed):
    if pad == "valid" and (kh > oh or kw > ow):
        return
    rng = np.random.default_rng(seed)
    data, xshape = _model(rng, oh, ow, cin, cout, kh, kw, s, pad, bias, act)
    x = rng.standard_normal(xshape).astype(np.float32)
    want = litert_run(data, [x])[0]
    g = load_tflite(data)
    np.testing.assert_allclose(run(g, x)[0], want, rtol=1e-5, atol=1e-5)
    again = export_tflite(g)
    np.testing.assert_allclose(litert_run(again, [x])[0], want, rtol=1e-5, atol=1e-5)


def test_transpose_conv_input_size_must_fit():
    rng = np.random.default_rng(0)
    data, _ = _model(rng, 6, 6, 2, 2, 3, 3, 2, "same", False, 0)
    import tests.frontend.tflite_builder as tb
    bad = tb.patch(data, "tensor 2.shape[1]", 5)       # the input is 3 high: a 6-high SAME conv gives 3
    with pytest.raises(KilnError, match="TRANSPOSE_CONV"):
        load_tflite(bad)


@settings(max_examples=40, deadline=None)
@given(oh=st.integers(2, 8), ow=st.integers(2, 8), cin=st.integers(1, 4), cout=st.integers(1, 4),
       k=st.integers(1, 3), s=st.integers(1, 3), pad=st.sampled_from(["same", "valid"]), bias=st.booleans(),
       act=st.sampled_from([0, 1, 3]), per_channel=st.booleans(), zx=st.integers(-128, 127),
       zo=st.integers(-128, 127), lo=st.floats(-9, -3), seed=st.integers(0, 2 ** 31))
def test_transpose_conv_int8_matches_litert(oh, ow, cin, cout, k, s, pad, bias, act, per_channel, zx, zo, lo, seed):
    """int8 TRANSPOSE_CONV (per-tensor and per-channel filters, bias, fused activations, zero
    points): Kiln's int8 reference equals LiteRT's reference kernel, and so does the re-export."""
    if pad == "valid" and k > min(oh, ow):
        return
    rng = np.random.default_rng(seed)
    G = conv_geometry((1, oh, ow, cout), (cin, k, k, cout), dict(stride=[s, s], padding=pad, dilation=[1, 1], groups=1))
    sx = 2.0 ** -4
    sw = 2.0 ** rng.uniform(-8, -5, cout if per_channel else 1)
    so = float(np.float32(sx * float(np.mean(sw)) * 2.0 ** -lo / 64))
    b = Builder()
    osh = b.tensor("output_shape", (4,), "int32", data=[1, oh, ow, cout])
    w = b.tensor("w", (cout, k, k, cin), "int8", data=rng.integers(-127, 128, (cout, k, k, cin)), scale=sw,
                 zero_point=[0] * len(sw), axis=0 if per_channel else None)
    x = b.tensor("x", (1, G["oh"], G["ow"], cin), "int8", scale=sx, zero_point=zx)
    ins = [osh, w, x]
    if bias:
        bs = np.float32(sx) * np.asarray(sw, np.float32)
        ins.append(b.tensor("b", (cout,), "int32", data=rng.integers(-5000, 5000, cout), scale=bs,
                            zero_point=[0] * len(bs), axis=0 if per_channel else None))
    y = b.tensor("y", (1, oh, ow, cout), "int8", scale=so, zero_point=zo)
    b.op("TRANSPOSE_CONV", ins, [y], "TransposeConvOptions", int8=True, Padding=0 if pad == "same" else 1, StrideW=s,
         StrideH=s, FusedActivationFunction=act)
    data = b.build([x], [y])
    xv = rng.integers(-128, 128, (1, G["oh"], G["ow"], cin)).astype(np.int8)
    want = litert_run(data, [xv])[0]
    g = load_tflite(data)
    np.testing.assert_array_equal(run(g, xv)[0], want)
    np.testing.assert_array_equal(litert_run(export_tflite(g), [xv])[0], want)


def test_transpose_conv_float_on_host_c(tmp_path):
    from kiln.backends import compile as compile_pkg
    rng = np.random.default_rng(3)
    data, xshape = _model(rng, 7, 6, 2, 3, 3, 3, 2, "same", True, 3)
    g = load_tflite(data)
    pkg = compile_pkg(g, target="host", out_dir=tmp_path, plot=False, measure_size=False)
    x = rng.standard_normal(xshape).astype(np.float32)
    np.testing.assert_allclose(pkg.run(x)[0], run(g, x)[0], rtol=1e-5, atol=1e-5)
