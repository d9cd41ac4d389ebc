"""C backend: every schedule bit-exact with the int8 reference, float within 1e-5 of NumPy, the
shared models' goldens, warning-free cross compiles, named errors. Packages are compiled once
per module (TVM + gcc are the slow part) and run on the host through ctypes."""
import dataclasses
import os
import re

import numpy as np
import pytest

from kiln.backends import compile as compile_pkg
from kiln.backends import cpus
from kiln.backends.cpus import TARGETS
from kiln.backends.lower import LoweringError
from kiln.backends.pipeline import BudgetError
from kiln.frontend import Graph, QParams, TensorType, run
from kiln.frontend.registry import OPS

RNG = np.random.default_rng(7)


def q(scale, zp):
    return QParams((scale,), (zp,))


def i8(shape):
    return RNG.integers(-128, 128, size=shape).astype(np.int8)


# ---- int8 op table ----------------------------------------------------------------------------
def _int8_graph():
    """One graph exercising every int8 kernel shape class; every intermediate is an output."""
    g = Graph("int8_table")
    g.add_input("x", TensorType((1, 7, 6, 8), "int8", q(0.05, 3)))
    outs = []

    def conv(name, src, O, KH, KW, I, act, groups=1, **attrs):
        w = i8((O, KH, KW, I))
        ws = tuple(float(s) for s in RNG.uniform(0.002, 0.02, O))
        g.add_const(name + "_w", w, QParams(ws, (0,) * O, 0))
        g.add_const(name + "_b", RNG.integers(-2000, 2000, O).astype(np.int32))
        t = g.types[src]
        a = dict(attrs, groups=groups, activation=act)
        from kiln.frontend.ops.nn import conv_geometry
        G = conv_geometry(t.shape, (O, KH, KW, I), {"stride": [1, 1], "padding": "valid", "dilation": [1, 1], **a})
        g.add_node("conv2d", [src, name + "_w", name + "_b"], a, name=name,
                   out_type=TensorType((1, G["oh"], G["ow"], O), "int8", q(float(RNG.uniform(0.05, 0.2)), int(RNG.integers(-20, 20)))))
        outs.append(name)
        return name

    c1 = conv("c_same", "x", 16, 3, 3, 8, "relu", padding="same")
    conv("c_stride", "x", 12, 3, 3, 8, "none", padding="same", stride=[2, 2])
    conv("c_1x1", c1, 8, 1, 1, 16, "relu6")
    conv("c_odd", "x", 5, 2, 3, 8, "none", padding="valid", dilation=[1, 2])
    # reductions that are not a multiple of 4 (5 input channels: 3x3 -> 45, 1x1 -> 5), as in the
    # first convs of the shared models
    conv("c_red45", "c_odd", 8, 3, 3, 5, "relu", padding="same")
    conv("c_red5", "c_odd", 4, 1, 1, 5, "none")
    conv("c_dw", c1, 16, 3, 3, 1, "relu", groups=16, padding="same")
    conv("c_dw_mult", "x", 16, 3, 3, 1, "none", groups=8, padding="same", stride=[2, 2])
    # depth multiplier 1 on DSP targets: kiln_dw_s8 (border pixels, strides, dilation, other sizes)
    conv("c_dw_s2", "x", 8, 3, 3, 1, "relu6", groups=8, padding="same", stride=[2, 2])
    conv("c_dw_5x5", "x", 8, 5, 5, 1, "none", groups=8, padding="same", dilation=[2, 2])
    conv("c_dw_valid", c1, 16, 3, 2, 1, "relu", groups=16, padding="valid", stride=[1, 2])
    g.add_node("pad", ["x"], {"pads": [0, 0, 1, 2, 2, 1, 0, 0]}, name="padded", out_type=TensorType((1, 10, 9, 8), "int8", q(0.05, 3)))
    conv("c_after_pad", "padded", 6, 3, 3, 8, "none")
    # an odd number of output pixels (5 x 5): the fused conv's last pixel pair holds one pixel
    conv("c_oddpix", "x", 6, 3, 2, 8, "relu", padding="valid")
    g.add_node("avg_pool2d", [c1], {"pool": [3, 3], "stride": [2, 2], "padding": "same"}, name="avg",
               out_type=g.types[c1].with_shape((1, 4, 3, 16)))
    g.add_node("max_pool2d", [c1], {"pool": [2, 2]}, name="maxp", out_type=g.types[c1].with_shape((1, 3, 3, 16)))
    g.add_node("mean", [c1], {"axes": [1, 2], "keepdims": True}, name="mean",
               out_type=TensorType((1, 1, 1, 16), "int8", q(0.03, -5)))
    g.add_node("add", ["c_same", "c_dw"], name="add", out_type=TensorType((1, 7, 6, 16), "int8", q(0.1, -3)))
    g.add_node("relu", ["add"], name="add_relu", out_type=g.types["add"])
    g.add_node("mul", ["c_same", "c_dw"], name="mul", out_type=TensorType((1, 7, 6, 16), "int8", q(0.2, 4)))
    g.add_node("sigmoid", ["c_1x1"], name="sig", out_type=TensorType((1, 7, 6, 8), "int8", q(1 / 256, -128)))
    g.add_node("tanh", ["c_1x1"], name="tanh", out_type=TensorType((1, 7, 6, 8), "int8", q(1 / 128, 0)))
    g.add_node("reshape", ["avg"], {"shape": [1, -1]}, name="flat", out_type=TensorType((1, 4 * 3 * 16), "int8", g.types["avg"].quant))
    wd = i8((10, 192))
    g.add_const("d_w", wd, QParams((0.004,), (0,)))
    g.add_const("d_b", RNG.integers(-500, 500, 10).astype(np.int32))
    g.add_node("dense", ["flat", "d_w", "d_b"], name="dense", out_type=TensorType((1, 10), "int8", q(0.15, 2)))
    # dense over many rows (7 x 6 pixels of 8 channels): the fused conv kernel as a 1x1 conv
    g.add_const("d2_w", i8((6, 8)), QParams(tuple(float(v) for v in RNG.uniform(0.002, 0.02, 6)), (0,) * 6, 0))
    g.add_const("d2_b", RNG.integers(-500, 500, 6).astype(np.int32))
    g.add_node("dense", ["c_1x1", "d2_w", "d2_b"], {"activation": "relu"}, name="dense_rows",
               out_type=TensorType((1, 7, 6, 6), "int8", q(0.12, -1)))
    g.add_node("softmax", ["dense"], name="softmax", out_type=TensorType((1, 10), "int8", q(1 / 256, -128)))
    g.add_node("concat", ["c_same", "c_same"], {"axis": 3}, name="cat", out_type=TensorType((1, 7, 6, 32), "int8", g.types["c_same"].quant))
    g.add_node("dequantize", ["softmax"], name="deq", out_type=TensorType((1, 10), "float32"))
    g.add_node("quantize", ["deq"], {"scale": [0.01], "zero_point": [5]}, name="req",
               out_type=TensorType((1, 10), "int8", q(0.01, 5)))
    outs += ["padded", "avg", "maxp", "mean", "add_relu", "mul", "sig", "tanh", "dense", "dense_rows", "softmax", "cat",
             "deq", "req"]
    g.outputs = outs
    return g


@pytest.fixture(scope="module")
def int8_graph():
    return _int8_graph()


# Kiln kernels (portable C) for the host and the M3; "plain": TVM's default schedules, the
# fallback for what the kernels do not cover
@pytest.mark.parametrize("target", ["host", "cortex-m3", "plain"])
def test_int8_ops_bit_exact(int8_graph, target, tmp_path_factory):
    if target == "plain":
        target = dataclasses.replace(cpus.get("cortex-m3"), kernels=False)
    pkg = compile_pkg(int8_graph, target=target, out_dir=tmp_path_factory.mktemp(getattr(target, "name", target)),
                      plot=False,
                      measure_size=False)
    for _trial in range(3):
        x = i8((1, 7, 6, 8))
        want = run(int8_graph, x)
        got = pkg.run(x)
        for name, w, gt in zip(int8_graph.outputs, want, got):
            assert gt.dtype == w.dtype, name
            np.testing.assert_array_equal(gt, w, err_msg=f"{name} ({target})")


@pytest.mark.parametrize("optimize", ["size", "speed"])
def test_int8_ops_bit_exact_weight_storage(int8_graph, optimize, tmp_path_factory):
    """optimize="size": every conv/dense stores int8 weights (kiln_conv8_s8 for these small
    layers, kiln_dot*_w8); "speed": small layers keep the int16 packing (kiln_dot2x2rq_w16,
    kiln_dot*_w16)."""
    pkg = compile_pkg(int8_graph, target="host", out_dir=tmp_path_factory.mktemp(optimize), plot=False,
                      measure_size=False, optimize=optimize)
    assert pkg.manifest.optimize == optimize
    src = open(os.path.join(pkg.path, "kernels.c")).read()
    bits = re.findall(r"kiln_conv_s8\([^;]*?, (8|16), \(&\(convq", src)
    if optimize == "size":     # layers under ops_nn.NARROW_MAX_MACS: the int8 pair, int8 weights
        assert "kiln_conv8_s8(" in src and not bits
    else:
        assert bits, "the int8 table has groups-1 convs on the fused path"
        assert set(bits) == {"16"}
    for _trial in range(3):
        x = i8((1, 7, 6, 8))
        for name, w, gt in zip(int8_graph.outputs, run(int8_graph, x), pkg.run(x)):
            np.testing.assert_array_equal(gt, w, err_msg=f"{name} (optimize={optimize})")


# ---- float op table ---------------------------------------------------------------------------
def _float_graph():
    g = Graph("float_table")
    g.add_input("x", TensorType((2, 6, 5, 4)))
    g.add_input("y", TensorType((5, 4)))
    f = lambda shape: RNG.standard_normal(shape).astype(np.float32)  # noqa: E731
    g.add_const("w", f((6, 3, 3, 4)))
    g.add_const("b", f((6,)))
    g.add_const("wd", f((8, 4, 3, 1)))
    g.add_const("wl", f((7, 4)))
    nodes = [
        ("conv2d", ["x", "w", "b"], {"padding": "same", "activation": "relu"}),
        ("conv2d", ["x", "w"], {"padding": [1, 0, 2, 1], "stride": [2, 1], "dilation": [1, 2]}),
        ("conv2d", ["x", "wd"], {"padding": "same", "groups": 4, "activation": "relu6"}),
        ("dense", ["x", "wl"], {}),
        ("matmul", ["y", "wl_t"], {}),
        ("avg_pool2d", ["x"], {"pool": [3, 3], "stride": [2, 2], "padding": "same"}),
        ("avg_pool2d", ["x"], {"pool": [2, 2], "padding": "same", "count_include_pad": True}),
        ("max_pool2d", ["x"], {"pool": [2, 2], "stride": [1, 1], "padding": "same"}),
        ("add", ["x", "y"], {}), ("sub", ["x", "y"], {}), ("mul", ["x", "y"], {}), ("div", ["x", "ypos"], {}),
        ("maximum", ["x", "y"], {}), ("minimum", ["x", "y"], {}),
        ("neg", ["x"], {}), ("exp", ["x"], {}), ("log", ["xpos"], {}), ("sqrt", ["xpos"], {}), ("tanh", ["x"], {}),
        ("sigmoid", ["x"], {}), ("relu", ["x"], {}), ("relu6", ["x3"], {}), ("pow", ["x"], {"exponent": 3.0}),
        ("softmax", ["x"], {"axis": 1}), ("log_softmax", ["x"], {"axis": -1}),
        ("sum", ["x"], {"axes": [1, 3]}), ("mean", ["x"], {"axes": [1, 2], "keepdims": True}), ("max", ["x"], {}),
        ("transpose", ["x"], {"perm": [0, 3, 1, 2]}), ("pad", ["x"], {"pads": [0, 0, 1, 0, 0, 2, 1, 1], "value": 0.5}),
        ("slice", ["x"], {"begin": [0, 1, 0, 1], "end": [2, 6, 5, 3], "strides": [1, 2, 2, 1]}),
        ("concat", ["x", "x3"], {"axis": 2}), ("broadcast_to", ["y"], {"shape": [3, 5, 4]}),
        ("reshape", ["x"], {"shape": [2, -1]}), ("cast", ["x"], {"dtype": "int32"}),
    ]
    g.add_const("wl_t", f((4, 7)))
    g.add_node("relu", ["x"], name="xr")
    g.add_const("one", np.ones((1,), np.float32) * 0.1)
    g.add_node("add", ["xr", "one"], name="xpos")
    g.add_node("div", ["xpos", "one"], name="ypos_full")
    g.add_node("slice", ["ypos_full"], {"begin": [0, 0, 0, 0], "end": [1, 1, 5, 4]}, name="ypos4")
    g.add_node("reshape", ["ypos4"], {"shape": [5, 4]}, name="ypos")
    g.add_const("three", np.full((1,), 3.0, np.float32))
    g.add_node("mul", ["x", "three"], name="x3")
    outs = ["xpos", "x3"]
    for k, (op, ins, attrs) in enumerate(nodes):
        outs.append(g.add_node(op, ins, attrs, name=f"{op}_{k}"))
    g.outputs = outs
    return g


def test_float_ops_match_numpy(tmp_path):
    g = _float_graph()
    pkg = compile_pkg(g, target="host", out_dir=tmp_path, plot=False, measure_size=False)
    x = RNG.standard_normal((2, 6, 5, 4)).astype(np.float32)
    y = RNG.standard_normal((5, 4)).astype(np.float32)
    want = run(g, x, y)
    got = pkg.run(x, y)
    for name, w, gt in zip(g.outputs, want, got):
        assert gt.shape == w.shape, name
        np.testing.assert_allclose(gt, w, rtol=1e-5, atol=1e-5, err_msg=name)


def test_float_ops_without_c_kernels_use_their_te_compute(tmp_path):
    """The C backend has no kernel of its own for float ops: gradient ops, log_softmax and int32
    arithmetic go through the op's TE compute like every float op, and match NumPy."""
    g = Graph("te_on_c")
    g.add_input("x", TensorType((2, 7, 6, 4)))
    g.add_input("gy", TensorType((2, 4, 3, 5)))
    g.add_input("gp", TensorType((2, 4, 3, 4)))
    g.add_input("n", TensorType((3, 4), "int32"))
    w = RNG.standard_normal((5, 3, 3, 4)).astype(np.float32)
    g.add_const("w", w)
    ca = {"stride": [2, 2], "padding": "same"}
    pa = {"pool": [3, 3], "stride": [2, 2], "padding": "same"}
    g.outputs = [
        g.add_node("conv2d_grad_input", ["gy", "w"], dict(input_shape=[2, 7, 6, 4], **ca), name="cgi"),
        g.add_node("conv2d_grad_weight", ["x", "gy"], dict(weight_shape=[5, 3, 3, 4], **ca), name="cgw"),
        g.add_node("max_pool2d_grad", ["x", "gp"], pa, name="mpg"),
        g.add_node("avg_pool2d_grad", ["gp"], dict(input_shape=[2, 7, 6, 4], **pa), name="apg"),
        g.add_node("log_softmax", ["x"], {"axis": 2}, name="lsm"),
        g.add_node("mul", ["n", "n"], name="nn"),
        g.add_node("max", ["x"], {}, name="xmax"),          # a scalar result
    ]
    pkg = compile_pkg(g, target="host", out_dir=tmp_path, plot=False, measure_size=False)
    feeds = [RNG.standard_normal((2, 7, 6, 4)).astype(np.float32),
             RNG.standard_normal((2, 4, 3, 5)).astype(np.float32), RNG.standard_normal((2, 4, 3, 4)).astype(np.float32),
             RNG.integers(-99, 99, (3, 4)).astype(np.int32)]
    for name, want, got in zip(g.outputs, run(g, *feeds), pkg.run(*feeds)):
        assert got.shape == want.shape and got.dtype == want.dtype, name
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=name)
    macs = {c.name: c.macs for c in pkg.manifest.commands}
    assert macs["cgi"] == macs["cgw"] == 2 * 4 * 3 * 5 * 3 * 3 * 4


def test_macs_are_the_ops_own(tmp_path):
    """The manifest's MACs, kiln inspect's and the op's ``macs`` rule are one number."""
    from kiln.commands.inspect import macs, summarize
    g = _float_graph()
    pkg = compile_pkg(g, target="host", out_dir=tmp_path, plot=False, measure_size=False)
    per_node = {c.name: c.macs for c in pkg.manifest.commands}
    for n in g.nodes:
        if OPS[n.op].macs is not None:
            assert per_node[n.name] == macs(g, n) > 0, n.name
    assert pkg.manifest.macs == summarize(g)["macs"]
    # conv2d [2, 6, 5, 4] * [6, 3, 3, 4] 'same', by hand
    assert per_node["conv2d_0"] == 2 * 6 * 5 * 6 * 3 * 3 * 4


def test_every_inference_op_has_a_c_lowering():
    import kiln.backends.ops  # noqa: F401
    from kiln.backends.lower import c_lowerable, register_pending
    register_pending()
    # training-only ops and ops on bool tensors have no C kernels (the C backend runs inference)
    training = {n for n in OPS if n.endswith("_grad") or n.endswith("_grad_input") or n.endswith("_grad_weight")
                or n.endswith("_gather")} | {"dropout", "fake_quant"}
    boolean = {"equal", "not_equal", "less", "less_equal", "greater", "greater_equal", "logical_and",
               "logical_or", "logical_not", "where"}
    missing = sorted(n for n in OPS if n not in training | boolean and not c_lowerable(n))
    assert not missing, f"ops without a C lowering: {missing}"


# ---- real models ------------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["kws_ref_model", "pretrainedResnet_quant", "vww_96_int8", "ad01_int8"])
def test_shared_model_goldens_bit_exact(shared_models, model, tmp_path):
    pkg = compile_pkg(os.path.join(shared_models, model + ".tflite"), target="host", out_dir=tmp_path,
                      measure_size=False)
    z = np.load(os.path.join(shared_models, model + ".golden.npz"))
    for k in range(8):
        np.testing.assert_array_equal(pkg.run(z[f"in_{k}"])[0], z[f"out_{k}"], err_msg=f"pair {k}")
    tflm = {"kws_ref_model": 22820, "pretrainedResnet_quant": 54996, "vww_96_int8": 100708, "ad01_int8": 2580}[model]
    assert pkg.arena_bytes < tflm * 0.62
    assert (tmp_path / "memory.png").exists() and (tmp_path / "manifest.json").exists()


@pytest.mark.parametrize("plain", [False, True])
def test_m0plus_on_kws_bit_exact(shared_models, tmp_path, plain):
    """Cortex-M0+: Kiln's kernels in portable C, and TVM's default schedules (the fallback)."""
    target = dataclasses.replace(cpus.get("cortex-m0plus"), kernels=not plain)
    pkg = compile_pkg(os.path.join(shared_models, "kws_ref_model.tflite"), target=target,
                      out_dir=tmp_path, plot=False, measure_size=False)
    src = (tmp_path / "kernels.c").read_text()
    assert ("kiln_conv_s8(" in src) != plain
    z = np.load(os.path.join(shared_models, "kws_ref_model.golden.npz"))
    for k in range(0, 8, 3):
        np.testing.assert_array_equal(pkg.run(z[f"in_{k}"])[0], z[f"out_{k}"])


@pytest.mark.slow
@pytest.mark.parametrize("target", sorted(t for t in TARGETS if t != "host"))
def test_cross_compiles_warning_free(shared_models, target, tmp_path):
    # measure_size compiles kernels.c and model.c with -Wall -Wextra -Werror for the core
    pkg = compile_pkg(os.path.join(shared_models, "pretrainedResnet_quant.tflite"), target=target,
                      out_dir=tmp_path, plot=False)
    assert pkg.manifest.sizes["code_bytes"] > 0


def test_package_contract(tmp_path):
    g = Graph("tiny")
    g.add_input("x", TensorType((1, 4)))
    g.add_const("w", np.eye(3, 4, dtype=np.float32))
    g.add_node("dense", ["x", "w"], {"activation": "relu"}, name="d")
    g.outputs = ["d"]
    pkg = compile_pkg(g, target="cortex-m4", out_dir=tmp_path, plot=False)
    for f in ("model.h", "model.c", "kernels.c", "kiln_cmd.h", "kiln_intrinsics.h", "manifest.json"):
        assert (tmp_path / f).exists(), f
    h = (tmp_path / "model.h").read_text()
    for needle in ("KILN_ARENA_SIZE", "KILN_INPUT_BYTES", "KILN_OUTPUT_BYTES", "KILN_NUM_COMMANDS",
                   "int kiln_model_run(uint8_t *arena, const void *input, void *output);", "kiln_profile_mark",
                   "kiln_command_names", "kiln_command_macs"):
        assert needle in h
    src = (tmp_path / "kernels.c").read_text() + (tmp_path / "model.c").read_text()
    for banned in ("tvm/", "TVMBackendAllocWorkspace", "malloc", "TVMFFI"):
        assert banned not in src
    m = pkg.manifest
    assert m.commands[0].macs == 12 and m.inputs[0].shape == [1, 4]
    x = np.array([[1, -2, 3, 4]], np.float32)
    np.testing.assert_allclose(pkg.run(x)[0], [[1, 0, 3]])


# ---- errors -----------------------------------------------------------------------------------
def test_unsupported_op_names_op_and_node(tmp_path):
    g = Graph("bad")
    g.add_input("x", TensorType((4,)))
    g.add_input("k", TensorType((), "int64"))
    g.add_node("dropout", ["x", "k"], name="drop_here")
    g.outputs = ["drop_here"]
    with pytest.raises(LoweringError, match=r"drop_here.*dropout"):
        compile_pkg(g, target="cortex-m4", out_dir=tmp_path)


def test_unsupported_dtype_names_node(tmp_path):
    g = Graph("bad")
    g.add_input("x", TensorType((4,), "float64"))
    g.add_node("relu", ["x"], name="r64")
    g.outputs = ["r64"]
    with pytest.raises(LoweringError, match=r"r64"):
        compile_pkg(g, target="cortex-m0plus", out_dir=tmp_path)


def test_int8_op_without_int8_kernel_names_node(tmp_path):
    """A quantised op the C backend has no int8 kernel for is refused, not computed on int8
    codes by its float TE compute."""
    g = Graph("bad")
    g.add_input("a", TensorType((4,), "int8", q(0.1, 0)))
    g.add_input("b", TensorType((4,), "int8", q(0.1, 0)))
    g.add_node("floor_mod", ["a", "b"], name="diff_here", out_type=TensorType((4,), "int8", q(0.2, 0)))
    g.outputs = ["diff_here"]
    with pytest.raises(LoweringError, match=r"diff_here.*floor_mod has no int8 kernel.*add"):
        compile_pkg(g, target="cortex-m4", out_dir=tmp_path, measure_size=False)


def test_unsupported_result_dtype_names_node(tmp_path):
    g = Graph("bad")
    g.add_input("x", TensorType((4,)))
    g.add_node("cast", ["x"], {"dtype": "int64"}, name="cast_here")
    g.outputs = ["cast_here"]
    with pytest.raises(LoweringError, match=r"cast_here.*int64"):
        compile_pkg(g, target="cortex-m4", out_dir=tmp_path, measure_size=False)


def test_ram_budget_overflow_is_reported(tmp_path):
    g = Graph("big")
    g.add_input("x", TensorType((1, 256)))
    g.add_const("w", np.ones((512, 256), np.float32))
    g.add_node("dense", ["x", "w"], name="d")
    g.outputs = ["d"]
    with pytest.raises(BudgetError, match=r"budget of 1000 B \(over by \d+ B\)"):
        compile_pkg(g, target="cortex-m4", out_dir=tmp_path, ram_budget=1000)


@pytest.mark.parametrize("int8_io", [False, True])
def test_ptq_digits_cnn_bit_exact(int8_io, tmp_path):
    """The demo's digits CNN (random init), post-training quantised: the host package matches the
    int8 reference on every test image (float I/O runs quantize -> int8 kernels -> dequantize)."""
    from kiln.frontend import manual_seed, trace
    from kiln.quantize.ptq import ptq
    from kiln.training.data import digits
    from kiln.training.zoo import digits_cnn
    manual_seed(0)
    g = trace(digits_cnn(), (1, 8, 8, 1))
    train, test = digits()
    xs = np.asarray(train[0] if isinstance(train, tuple) else train.x)[:128]
    qg = ptq(g, xs, int8_io=int8_io)
    pkg = compile_pkg(qg, target="cortex-m4" if int8_io else "host", out_dir=tmp_path, plot=False, measure_size=False)
    tx = np.asarray(test[0] if isinstance(test, tuple) else test.x)[:60]
    from kiln.frontend import run as ref_run
    for x in tx:
        x = x[None]
        if int8_io:
            t = qg.types[qg.inputs[0]]
            x = np.clip(np.round(x / t.quant.scale[0]) + t.quant.zero_point[0], -128, 127).astype(np.int8)
        want = ref_run(qg, x)[0]
        got = pkg.run(x)[0]
        np.testing.assert_array_equal(got, want)
