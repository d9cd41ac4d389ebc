"""int8 dot products on CUDA (backends/cuda_dp4a.py): ``kiln.dp4a``'s exact lowering, the weight
packing, and random int8 conv2d / dense layers (paddings, strides, groups, reduction lengths that
are not a multiple of 4, zero points) compiled to CUDA and run on cuda-sim against Kiln's int8
reference (itself LiteRT's bit for bit: tests/quantize/test_litert_property.py)."""
import os

import numpy as np
import pytest
import tvm
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from tvm import te

from kiln.backends import cuda, cuda_dp4a, nvrtc
from kiln.frontend import Graph, QParams, TensorType, run
from kiln.frontend.registry import get_op

from .test_cuda_int8 import _model

EXAMPLES = int(os.environ.get("KILN_PROPERTY_EXAMPLES", 3))
# no shrinking: each example compiles a package (seconds); a failure prints its full example
SETTINGS = dict(deadline=None, phases=[Phase.explicit, Phase.generate],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


# ---- the op and the packing -----------------------------------------------------------------
def _bytes(words):
    return np.asarray(words, np.int32).view(np.int8).reshape(*np.shape(words), 4).astype(np.int64)


def test_dp4a_exact_lowering_matches_numpy():
    """kiln.dp4a lowered for LLVM (the definition OpenCL gets too) = sum of 4 signed byte
    products plus the accumulator, on random words and the extremes (-128 * -128, 127 * -128)."""
    rng = np.random.default_rng(0)
    special = np.array([0x80808080, 0x7f7f7f7f, 0x807f80ff, -1, 0, 1], np.int64).astype(np.uint32).view(np.int32)
    a = np.concatenate([rng.integers(-2 ** 31, 2 ** 31, 250).astype(np.int32), special])
    b = np.concatenate([rng.integers(-2 ** 31, 2 ** 31, 250).astype(np.int32), special[::-1]])
    ta, tb = te.placeholder((256,), "int32", name="a"), te.placeholder((256,), "int32", name="b")
    y = te.compute((256,), lambda i: cuda_dp4a.dp4a(ta[i], tb[i]) + 7, name="y")
    f = tvm.tirx.build(te.create_prim_func([ta, tb, y]), target="llvm")
    out = tvm.runtime.tensor(np.zeros(256, np.int32))
    f(tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    np.testing.assert_array_equal(out.numpy(), (_bytes(a) * _bytes(b)).sum(-1) + 7)


def test_pack_rows_little_endian_zero_tail():
    w = np.arange(-7, 7).reshape(2, 7)
    p = cuda_dp4a.pack_rows(w)
    assert p.dtype == np.int32 and p.shape == (2, 2)
    np.testing.assert_array_equal(_bytes(p).reshape(2, 8), np.pad(w, ((0, 0), (0, 1))))


def test_folded_bias_refuses_what_leaves_int32():
    w = np.full((1, 4), 127)
    assert cuda_dp4a.folded_bias([5], w, -3).tolist() == [5 + 3 * 508]
    assert cuda_dp4a.folded_bias([2 ** 31 - 100], w, -128) is None


# ---- random layers on cuda-sim ----------------------------------------------------------------
def _q(scale, zp=0):
    return QParams((float(np.float32(scale)),), (int(zp),))


def _graph(op, x_type, w, b, attrs, out_q):
    g = Graph(op)
    g.add_input("x", x_type)
    s_w = float(np.float32(2.0 ** -7))
    g.add_const("w", np.asarray(w, np.int8), _q(s_w))
    g.add_const("b", np.asarray(b, np.int32), _q(x_type.quant.scale[0] * s_w))
    a = get_op(op).normalize_attrs(attrs)
    t = get_op(op).rule("infer")([g.types["x"], g.types["w"], g.types["b"]], a)
    g.add_node(op, ["x", "w", "b"], a, name="y", out_type=TensorType(t.shape, "int8", out_q))
    g.outputs = ["y"]
    return g


def _sim_equals_reference(tmp_path, g, x):
    pytest.importorskip("pyopencl")
    from kiln.backends import cuda_sim
    pkg = cuda.compile(g, str(tmp_path / "pkg"), arch="sm_80", check=False)
    try:
        sim = cuda_sim.Simulator(pkg)
    except cuda_sim.SimUnavailable as e:
        pytest.skip(str(e))
    want = run(g, x)[0]
    got = sim(x)[0].reshape(want.shape)
    np.testing.assert_array_equal(got, want)
    return pkg


def _conv_case(rng, h, w, cin, cout, k, stride, padding, groups, zx, act):
    cout = cout * groups
    x_type = TensorType((1, h, w, cin * groups), "int8", _q(2.0 ** -4, zx))
    wt = rng.integers(-127, 128, (cout, k, k, cin))
    b = rng.integers(-3000, 3000, cout)
    out_q = _q(2.0 ** -4 * 2.0 ** -7 * np.sqrt(k * k * cin) * 40, int(rng.integers(-20, 20)))
    g = _graph("conv2d", x_type, wt, b, dict(stride=[stride, stride], padding=padding, dilation=[1, 1],
                                              groups=groups, activation=act), out_q)
    return g, rng.integers(-128, 128, x_type.shape).astype(np.int8)


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(h=st.integers(3, 9), w=st.integers(3, 9), cin=st.integers(1, 9), cout=st.integers(1, 6),
       k=st.integers(1, 3), stride=st.integers(1, 2), padding=st.sampled_from(["same", "valid"]),
       groups=st.sampled_from([1, 1, 2]), zx=st.integers(-128, 127), act=st.sampled_from(["none", "relu"]),
       seed=st.integers(0, 2 ** 31))
def test_random_conv2d_bit_exact_on_cuda_sim(tmp_path_factory, h, w, cin, cout, k, stride, padding, groups, zx,
                                             act, seed):
    g, x = _conv_case(np.random.default_rng(seed), h, w, cin, cout, k, stride, padding, groups, zx, act)
    pkg = _sim_equals_reference(tmp_path_factory.mktemp("conv"), g, x)
    depthwise = cin == 1 and groups > 1           # one channel per group: the int32 rule
    assert ("__dp4a" in open(os.path.join(pkg, "kernels.cu")).read()) != depthwise


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(batch=st.integers(1, 3), k=st.integers(1, 70), n=st.integers(1, 40), zx=st.integers(-128, 127),
       seed=st.integers(0, 2 ** 31))
def test_random_dense_bit_exact_on_cuda_sim(tmp_path_factory, batch, k, n, zx, seed):
    rng = np.random.default_rng(seed)
    x_type = TensorType((batch, k), "int8", _q(2.0 ** -4, zx))
    out_q = _q(2.0 ** -4 * 2.0 ** -7 * np.sqrt(k) * 40, int(rng.integers(-20, 20)))
    g = _graph("dense", x_type, rng.integers(-127, 128, (n, k)), rng.integers(-3000, 3000, n),
               dict(activation="none"), out_q)
    pkg = _sim_equals_reference(tmp_path_factory.mktemp("dense"), g, rng.integers(-128, 128, (batch, k)).astype(np.int8))
    assert "__dp4a" in open(os.path.join(pkg, "kernels.cu")).read()


@pytest.mark.parametrize("op,cin,dp4a", [("conv2d", 4, True), ("conv2d", 3, True), ("conv2d", 1, True),
                                         ("conv2d", 1, False), ("dense", 2, True), ("dense", 1, False)])
def test_reduction_of_one_word_bit_exact_on_cuda_sim(tmp_path, monkeypatch, op, cin, dp4a):
    """A 1x1 convolution over <= 4 channels (one dp4a word) or over 1 channel with the int32 rule,
    and a dense layer with K <= 4: the reduction runs over one element, which DLight's rules took
    for spatial but kept the init of (Fallback inlined the requantisation into both and failed
    on its Let-bound temporaries). ``cuda.unit_reductions_to_spatial`` writes it as spatial."""
    if not dp4a:
        monkeypatch.setattr(cuda_dp4a, "conv2d_acc", lambda *a: None)
        monkeypatch.setattr(cuda_dp4a, "dense_acc", lambda *a: None)
    rng = np.random.default_rng(cin)
    if op == "conv2d":
        x_type = TensorType((2, 5, 4, cin), "int8", _q(2.0 ** -4, 7))
        g = _graph("conv2d", x_type, rng.integers(-127, 128, (6, 1, 1, cin)), rng.integers(-3000, 3000, 6),
                   dict(stride=[1, 1], padding="same", dilation=[1, 1], groups=1, activation="relu"), _q(0.02, -3))
    else:
        x_type = TensorType((3, cin), "int8", _q(2.0 ** -4, -5))
        g = _graph("dense", x_type, rng.integers(-127, 128, (7, cin)), rng.integers(-3000, 3000, 7),
                   dict(activation="none"), _q(0.01, 2))
    x = rng.integers(-128, 128, x_type.shape).astype(np.int8)
    pkg = _sim_equals_reference(tmp_path, g, x)
    assert ("__dp4a" in open(os.path.join(pkg, "kernels.cu")).read()) == dp4a


def test_unit_reduction_becomes_spatial():
    """The rewrite keeps every other block and loop; a reduction over more than one element stays."""
    x = te.placeholder((3, 1), "int32", name="x")
    r1, r2 = te.reduce_axis((0, 1), "r1"), te.reduce_axis((0, 2), "r2")
    one = te.compute((3,), lambda i: te.sum(x[i, r1] * 5, axis=[r1]), name="one")
    two = te.compute((3,), lambda i: te.sum(x[i, 0] * r2, axis=[r2]), name="two")
    f = te.create_prim_func([x, one, two])
    g = cuda.unit_reductions_to_spatial(f)
    text = g.script()
    assert "T.init()" in text and text.count("T.init()") == 1 and "r1" not in text
    f2 = te.create_prim_func([x, two])
    assert cuda.unit_reductions_to_spatial(f2).same_as(f2)
    a = np.arange(3, dtype=np.int32).reshape(3, 1) - 1
    outs = [tvm.runtime.tensor(np.zeros(3, np.int32)) for _ in range(2)]
    tvm.tirx.build(g, target="llvm")(tvm.runtime.tensor(a), *outs)
    np.testing.assert_array_equal(outs[0].numpy(), a[:, 0] * 5)
    np.testing.assert_array_equal(outs[1].numpy(), a[:, 0])


def test_depthwise_keeps_the_int32_rule(tmp_path):
    """A depthwise convolution reduces over kh x kw, not packed channels: no dp4a, still exact."""
    rng = np.random.default_rng(3)
    x_type = TensorType((1, 6, 6, 8), "int8", _q(2.0 ** -4, 5))
    g = _graph("conv2d", x_type, rng.integers(-127, 128, (8, 3, 3, 1)), rng.integers(-3000, 3000, 8),
               dict(stride=[1, 1], padding="same", dilation=[1, 1], groups=8, activation="none"), _q(0.05, -3))
    pkg = _sim_equals_reference(tmp_path, g, rng.integers(-128, 128, x_type.shape).astype(np.int8))
    assert "__dp4a" not in open(os.path.join(pkg, "kernels.cu")).read()


# ---- a real model's kernels ---------------------------------------------------------------------
def test_emitted_cuda_calls_dp4a_and_ptxas_assembles_it(tmp_path):
    """The FC autoencoder's kernels call __dp4a; the OpenCL build (cuda-sim) has the exact
    definition instead; NVRTC + ptxas emit dp4a.s32.s32 for sm_80 and sm_90."""
    from kiln.frontend.loader import load_model
    pkg = cuda.compile(load_model(_model("ad01_int8")), str(tmp_path / "p"), arch="sm_80", check=False)
    src = open(os.path.join(pkg, "kernels.cu")).read()
    assert src.count("__dp4a(") >= 10 and "kiln_dp4a" not in src
    try:
        nvrtc.toolkit()
    except nvrtc.NvrtcUnavailable as e:
        pytest.skip(str(e))
    for arch in ("sm_80", "sm_90"):
        assert "dp4a.s32.s32" in nvrtc.compile_ptx(src, arch)
    pytest.importorskip("pyopencl")
    from kiln.backends import cuda_sim
    assert "__dp4a(" not in cuda_sim.opencl_source(pkg)
