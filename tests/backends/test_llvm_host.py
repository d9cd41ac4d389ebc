"""Host LLVM backend (backends/llvm_host.py) against the NumPy reference: forward and
training-step graphs, every float op's TE rule, the structure-keyed cache, errors, verify target."""
import numpy as np
import pytest

import kiln
from kiln.backends import llvm_host, tvm_te
from kiln.frontend import executor
from kiln.frontend.graph import Graph
from kiln.frontend.registry import OPS
from kiln.frontend.types import TensorType
from tests.backends.server_models import make

TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("KILN_CACHE", str(tmp_path_factory.getbasetemp() / "kiln-cache"))


def close(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, **TOL)


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_forward_and_training_step_match_numpy(name):
    fwd, step, x, t = make(name)
    close(llvm_host.compile(fwd)(x), executor.run(fwd, x))
    close(llvm_host.compile(step)(x, t), executor.run(step, x, t))


def test_batchnorm_buffer_updates_and_loss_outputs():
    _, _, x, _ = make("cnn")
    from kiln.training.step import StepGraph
    from tests.backends.server_models import CNN
    kiln.frontend.manual_seed(1)
    sg = StepGraph(CNN(), "cross_entropy", (16, 16, 3), 4)
    labels = np.array([0, 3, 1, 4])
    feeds = sg.feeds(x, labels)
    want, wupd = executor.run_updates(sg.graph, feeds=feeds)
    cg = llvm_host.compile(sg.graph, with_updates=True)
    got, gupd = cg.run_updates(feeds=feeds)
    close(got, want)
    assert set(gupd) == set(wupd) and wupd
    for k in wupd:
        np.testing.assert_allclose(gupd[k], wupd[k], **TOL)


def test_cache_is_keyed_by_structure_not_values():
    fwd, _, x, _ = make("mlp")
    a = llvm_host.compile(fwd)
    b = llvm_host.compile(fwd)
    assert b.cached and a.lib_path == b.lib_path
    new = {k: (v * 0.5 + 0.1).astype(v.dtype) for k, v in fwd.params.items()}
    assert tvm_te.graph_signature(fwd) == tvm_te.graph_signature(_with_params(fwd, new))
    close(b(x, params=new), executor.run(fwd, x, params=new))
    # a different structure is a different module
    _, step, _, _ = make("mlp")
    assert tvm_te.graph_signature(step) != tvm_te.graph_signature(fwd)


def _with_params(g, params):
    g2 = g.copy()
    g2.params = dict(params)
    return g2


# ---- every float op: one graph holding a table of single-op cases (one build) -----------------
def _op_table():
    rng = np.random.default_rng(3)
    g = Graph("op_table")
    feeds = {}

    def inp(shape, dtype="float32", positive=False):
        name = f"in{len(feeds)}"
        g.add_input(name, TensorType(shape, dtype))
        v = rng.standard_normal(shape).astype(dtype)
        if positive:
            v = np.abs(v) + 0.5
        feeds[name] = v
        return name
    outs = []

    def node(op, inputs, **attrs):
        outs.append(g.add_node(op, inputs, attrs))
        return outs[-1]
    a, b, p = inp((3, 4, 5)), inp((4, 1)), inp((3, 4, 5), positive=True)
    for op in ("neg", "exp", "tanh", "sigmoid", "relu", "relu6"):
        node(op, [a])
    node("log", [p]), node("sqrt", [p]), node("pow", [p], exponent=2.0), node("pow", [p], exponent=-1.5)
    for op in ("add", "sub", "mul", "div", "maximum", "minimum"):
        node(op, [a, b])
    c = node("greater", [a, b])
    node("cast", [c], dtype="float32")
    node("where", [node("logical_or", [node("logical_and", [c, node("less_equal", [a, b])]),
                                        node("logical_not", [node("not_equal", [a, a])])]), a, b])
    node("cast", [node("equal", [a, b])], dtype="float32")
    node("cast", [node("greater_equal", [a, b])], dtype="float32")
    node("cast", [node("less", [a, b])], dtype="float32")
    for axes, keep in ((None, False), ([1], True), ([0, 2], False)):
        node("sum", [a], axes=axes, keepdims=keep)
        node("mean", [a], axes=axes, keepdims=keep)
        node("max", [a], axes=axes, keepdims=keep)
    node("softmax", [a], axis=1), node("log_softmax", [a], axis=-1)
    node("reshape", [a], shape=[5, -1]), node("transpose", [a], perm=[2, 0, 1])
    node("broadcast_to", [b], shape=[2, 4, 6]), node("concat", [a, a], axis=1)
    node("pad", [a], pads=[0, 1, 2, 0, 1, 1], value=0.5)
    s = node("slice", [a], begin=[0, 1, 0], end=[3, 4, 5], strides=[2, 1, 2])
    node("slice_grad", [s], shape=[3, 4, 5], begin=[0, 1, 0], end=[3, 4, 5], strides=[2, 1, 2])
    for op in ("abs", "square", "sin", "cos", "floor", "ceil", "round", "elu", "hard_swish"):   # element-wise family
        node(op, [a])
    node("rsqrt", [p]), node("leaky_relu", [a], alpha=0.3), node("add_n", [a, p, a])
    for op in ("squared_difference", "prelu", "floor_div", "floor_mod"):
        node(op, [a, b])
    m1, m2 = inp((2, 3, 4)), inp((4, 6))
    node("matmul", [m1, m2])
    w = inp((6, 4))
    node("dense", [m1, w], activation="relu6")
    x = inp((2, 7, 6, 4))
    for stride, pad, dil, groups in (([1, 1], "same", [1, 1], 1), ([2, 2], "same", [1, 1], 1),
                                     ([2, 1], "valid", [1, 2], 2), ([1, 1], [1, 0, 2, 1], [2, 1], 4)):
        cw = inp((8 if groups != 4 else 4, 3, 3, 4 // groups))
        bias = inp((8 if groups != 4 else 4,))
        ca = dict(stride=stride, padding=pad, dilation=dil, groups=groups)
        y = node("conv2d", [x, cw, bias], activation="relu", **ca)
        node("conv2d_grad_input", [y, cw], input_shape=[2, 7, 6, 4], **ca)
        node("conv2d_grad_weight", [x, y], weight_shape=list(g.types[cw].shape), **ca)
    for pool, stride, pad in (([2, 2], None, "valid"), ([3, 3], [2, 2], "same"), ([2, 3], [1, 2], [1, 0, 1, 1])):
        pa = dict(pool=pool, stride=stride, padding=pad)
        y = node("avg_pool2d", [x], **pa)
        node("avg_pool2d_grad", [y], input_shape=[2, 7, 6, 4], **pa)
        yc = node("avg_pool2d", [x], count_include_pad=True, **pa)
        node("avg_pool2d_grad", [yc], input_shape=[2, 7, 6, 4], count_include_pad=True, **pa)
        mp = node("max_pool2d", [x], **pa)
        node("max_pool2d_grad", [x, mp], **pa)
        node("max_pool2d_gather", [x, x], **pa)
    # frontend/ops/recurrent.py, l2pool.py, transpose_conv.py
    lx = inp((2, 3, 4))
    lw = [inp((5, 4)) for _ in range(4)] + [inp((5, 5)) for _ in range(4)] + [inp((5,)) for _ in range(4)]
    node("lstm", [lx] + lw + [inp((2, 5)), inp((2, 5))], cell_clip=0.8)
    node("l2_pool2d", [x], pool=[3, 3], stride=[2, 2], padding="same", activation="relu6")
    node("transpose_conv2d", [x, inp((3, 3, 3, 4)), inp((3,))], output_shape=[2, 14, 12, 3], stride=[2, 2],
         padding="same", activation="relu")
    # data movement and reductions (frontend/ops: gather, resize, reductions, argcum, l2norm)
    g.add_const("gidx", np.asarray([[2, 0], [1, 1]], np.int32))
    gth = node("gather", [a, "gidx"], axis=1)
    node("gather_grad", [gth, "gidx"], shape=[3, 4, 5], axis=1)
    rz = node("resize", [x], size=[9, 5], mode="bilinear", half_pixel_centers=True)
    node("resize_grad", [rz], in_size=[7, 6], size=[9, 5], mode="bilinear", half_pixel_centers=True)
    node("resize", [x], size=[3, 8], mode="nearest", align_corners=True)
    node("min", [a], axes=[1], keepdims=False), node("l2_normalize", [a])
    node("cast", [node("argmax", [a], axis=1)], dtype="float32")
    node("cast", [node("argmin", [a], axis=-1)], dtype="float32")
    node("cumsum", [a], axis=1, exclusive=True, reverse=True)
    g.add_const("dstart", np.asarray([2, -1, 4], np.int32))                 # clamped to [1, 0, 3]
    node("dynamic_update_slice", [a, node("dynamic_slice", [a, "dstart"], size=[2, 3, 2]), "dstart"])
    node("reduce_all", [node("greater", [a, a])], axes=[1], keepdims=False)
    sv = node("svdf_state", [inp((2, 5)), inp((6, 5)), inp((2, 18))])
    node("svdf", [sv, inp((6, 3)), inp((3,))], rank=2, activation="relu")
    g.outputs = [o for o in outs if g.types[o].dtype != "bool"]
    return g.validate(), feeds


def test_every_float_op_matches_numpy():
    g, feeds = _op_table()
    covered = {n.op for n in g.nodes}
    float_ops = {n for n, o in OPS.items() if o.ref is not None and o.ref.__module__.startswith("kiln.frontend.ops")
                 and o.ref.__module__ != "kiln.frontend.ops.quant"}   # the quantisation ops: tests/quantize
    no_te = {n for n, o in OPS.items() if o.te is None}   # host-llvm compiles TE computes (test_te_rules.NO_TE)
    assert float_ops - covered - no_te == set(), "ops missing from the table"
    got = llvm_host.compile(g)(feeds=feeds)
    want = executor.run(g, feeds=feeds)
    for name, gv, wv in zip(g.outputs, got, want):
        np.testing.assert_allclose(gv, wv, err_msg=f"{name} ({g.producer(name).op})", **TOL)


def test_max_pool_grad_ties_go_to_first_maximum():
    g = Graph("ties")
    g.add_input("x", TensorType((1, 4, 4, 1)))
    g.add_input("gy", TensorType((1, 2, 2, 1)))
    g.outputs = [g.add_node("max_pool2d_grad", ["x", "gy"], {"pool": [2, 2]})]
    x = np.ones((1, 4, 4, 1), np.float32)
    gy = np.arange(1, 5, dtype=np.float32).reshape(1, 2, 2, 1)
    np.testing.assert_array_equal(llvm_host.compile(g)(x, gy)[0], executor.run(g, x, gy)[0])


def test_dropout_matches_reference_mask():
    g = Graph("drop")
    g.add_input("x", TensorType((4, 16)))
    g.add_input("key", TensorType((), "int64"))
    d = g.add_node("dropout", ["x", "key"], {"rate": 0.3, "salt": 5})
    g.outputs = [g.add_node("relu", [d])]
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    cg = llvm_host.compile(g)
    for key in (1, 2):
        close(cg(x, np.int64(key)), executor.run(g, x, np.int64(key)))


def test_missing_te_rule_names_op_and_node():
    fwd, _, x, _ = make("mlp")
    g = fwd.copy()
    g.outputs = [g.add_node("tanh", [g.outputs[0]], name="my_tanh")]
    rule, OPS["tanh"].te = OPS["tanh"].te, None
    try:
        with pytest.raises(NotImplementedError, match=r"TE lowering for 'tanh'.*'my_tanh'"):
            llvm_host.compile(g)
    finally:
        OPS["tanh"].te = rule


def test_quantised_graph_is_rejected():
    g = Graph("q")
    from kiln.frontend.types import QParams
    g.add_input("x", TensorType((2, 4), "int8", QParams(0.1, 0)))
    g.outputs = [g.add_node("reshape", ["x"], {"shape": [8]})]
    with pytest.raises(NotImplementedError, match="quantised operand"):
        llvm_host.compile(g)


def test_host_llvm_verify_target(tmp_path):
    from kiln.commands.verify import verify
    fwd, _, x, _ = make("mlp")
    path = tmp_path / "mlp.json"
    kiln.save(fwd, str(path))
    xs = [x, x * 0.5]
    np.savez(tmp_path / "golden.npz", **{f"in_{k}": v for k, v in enumerate(xs)},
             **{f"out_{k}": executor.run(fwd, v)[0] for k, v in enumerate(xs)})
    rep = verify(str(path), str(tmp_path / "golden.npz"), "host-llvm")
    assert rep["ok"], rep


@pytest.mark.slow
@pytest.mark.parametrize("model", ["digits-cnn", "ds-cnn", "fc-autoencoder"])
def test_zoo_training_steps_match_numpy(model):
    from kiln.training import zoo
    from kiln.training.step import StepGraph
    zm = zoo.get(model)
    sg = StepGraph(zm.module, zm.loss, zm.input_shape[1:], 8)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8,) + tuple(zm.input_shape[1:])).astype(np.float32)
    y = rng.integers(0, zm.num_classes or 2, 8) if sg.target_input == "labels" else None
    feeds = sg.feeds(x, y, 3)
    got = llvm_host.compile(sg.graph)(feeds=feeds)
    want = executor.run(sg.graph, feeds=feeds)
    for gv, wv in zip(got, want):
        np.testing.assert_allclose(gv, wv, rtol=1e-4, atol=1e-5)


# ---- register-tiled reductions (schedule_cpu: _tiled_reduction) -------------------------------
def _conv_cases():
    """Channel counts that take the tiled path (multiples of 16, 4..16) and ones that do not
    (40), odd spatial extents, stride 2, one input channel, depthwise, pointwise, dense."""
    rng = np.random.default_rng(5)
    g = Graph("tiled_convs")
    feeds = {}

    def inp(shape, scale=1.0):   # weights scaled by 1/sqrt(fan-in): O(1) outputs, so 1e-5 is
        name = f"in{len(feeds)}"    # a rounding bound and not a summation-order lottery
        g.add_input(name, TensorType(shape, "float32"))
        feeds[name] = (rng.standard_normal(shape) * scale).astype(np.float32)
        return name
    outs = []
    for xs, ws, stride, groups in (((3, 11, 7, 1), (32, 5, 3, 1), [2, 2], 1),      # first conv, I=1
                                   ((2, 9, 5, 32), (32, 3, 3, 1), [1, 1], 32),     # depthwise
                                   ((2, 9, 5, 64), (48, 1, 1, 64), [1, 1], 1),     # pointwise
                                   ((2, 8, 8, 16), (32, 3, 3, 16), [2, 2], 1),     # strided 3x3
                                   ((2, 6, 7, 12), (40, 3, 3, 12), [1, 1], 1)):    # 40 lanes: untiled
        x, w = inp(xs), inp(ws, 1 / np.sqrt(np.prod(ws[1:])))
        ca = dict(stride=stride, padding="same", dilation=[1, 1], groups=groups)
        y = g.add_node("conv2d", [x, w], dict(activation="none", **ca))
        gy = inp(g.types[y].shape, 1 / np.sqrt(np.prod(g.types[y].shape[:3])))
        outs += [y, g.add_node("conv2d_grad_input", [gy, w], dict(input_shape=list(xs), **ca)),
                 g.add_node("conv2d_grad_weight", [x, gy], dict(weight_shape=list(ws), **ca))]
    d, dw = inp((24, 64)), inp((32, 64), 0.125)
    outs.append(g.add_node("dense", [d, dw], dict(activation="none")))
    for shape in ((3, 5, 7, 48), (2, 5, 6, 12), (4, 3, 3, 40)):    # per-channel (BatchNorm) reductions
        t = inp(shape)
        outs += [g.add_node("sum", [t], dict(axes=[0, 1, 2], keepdims=False)),
                 g.add_node("mean", [t], dict(axes=[0, 1, 2], keepdims=True))]
    g.outputs = outs
    return g.validate(), feeds


def test_tiled_conv_grad_and_channel_reduction_schedules_match_numpy():
    g, feeds = _conv_cases()
    got = llvm_host.compile(g)(feeds=feeds)
    want = executor.run(g, feeds=feeds)
    for name, gv, wv in zip(g.outputs, got, want):
        np.testing.assert_allclose(gv, wv, err_msg=f"{name} ({g.producer(name).op})", **TOL)


def test_conv_schedule_is_register_tiled_with_packed_weights():
    from tvm import te
    x, w = te.placeholder((2, 8, 8, 16), name="x"), te.placeholder((32, 3, 3, 16), name="w")
    out = TensorType((2, 8, 8, 32), "float32")
    a = dict(stride=[1, 1], padding="same", dilation=[1, 1], groups=1, activation="none")
    y = tvm_te.lowering("conv2d")([x, w], a, out)
    f = llvm_host.schedule_cpu_func(te.create_prim_func([x, w, y]), llvm_host.host_target(1))
    text = f.script()
    assert 'scope="local"' in text                    # accumulators in a local (register) tile
    assert "w_global = T.sblock_alloc_buffer((3, 3, 16, 32))" in text   # OHWI packed to HWIO
    assert "T.vectorized(16)" in text and "T.unroll(8)" in text
