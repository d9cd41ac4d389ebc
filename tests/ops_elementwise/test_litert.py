"""The element-wise / activation family against LiteRT: int8 bit for bit with the reference
kernels (BUILTIN_REF) over random shapes, broadcasts, scales and zero points; float against
LiteRT's float kernels; .tflite export -> import round trips."""
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kiln.frontend.errors
import kiln.quantize  # noqa: F401
from kiln.frontend import Graph, TensorType, run
from kiln.frontend.tflite_import import load_tflite
from kiln.quantize.tflite_export import export_tflite
from tests.quantize.litert_util import assert_same, compare, litert_run, q, single_op

SETTINGS = dict(max_examples=int(os.environ.get("KILN_PROPERTY_EXAMPLES", 40)), deadline=None,
                suppress_health_check=[HealthCheck.too_slow])
zp = st.integers(-128, 127)
log_scale = st.floats(-9.0, 1.0)


def i8(rng, shape):
    return rng.integers(-128, 128, size=shape).astype(np.int8)


def _bshape(rng, shape):
    """A shape that broadcasts against ``shape``: some dims 1, maybe fewer leading dims."""
    s = [1 if rng.random() < 0.4 else d for d in shape]
    return tuple(s[int(rng.integers(0, len(s) + 1)):]) or (1,)


# ---- int8 binary: sub, squared_difference, maximum, minimum (ranks 1-6, NumPy broadcasting) ------
@settings(**SETTINGS)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=6), swap=st.booleans(),
       op=st.sampled_from(["sub", "squared_difference", "maximum", "minimum"]), z1=zp, z2=zp, zo=zp,
       l1=log_scale, l2=log_scale, seed=st.integers(0, 2 ** 31))
def test_int8_binary(shape, swap, op, z1, z2, zo, l1, l2, seed):
    rng = np.random.default_rng(seed)
    s1, s2 = tuple(shape), _bshape(rng, shape)
    if swap:
        s1, s2 = s2, s1
    if op == "squared_difference":
        lo = 2 * max(l1, l2) + 8 + rng.uniform(-2, 2)
    else:
        lo = max(l1, l2) + rng.uniform(-1, 2)
    g = single_op(op, [("a", TensorType(s1, "int8", q(2.0 ** l1, z1)), None),
                       ("b", TensorType(s2, "int8", q(2.0 ** l2, z2)), None)], {}, q(2.0 ** lo, zo))
    got, want = compare(g, [i8(rng, s1), i8(rng, s2)])
    assert_same(got, want, f"{op} {s1} {s2}")


@settings(**SETTINGS)
@given(h=st.integers(1, 5), w=st.integers(1, 5), c=st.integers(1, 6), alpha_shape=st.sampled_from(["c", "1c", "11c", "hwc"]),
       zi=zp, za=zp, zo=zp, ls=log_scale, la=st.floats(-9.0, -1.0), dl=st.floats(-2.0, 2.0), seed=st.integers(0, 2 ** 31))
def test_int8_prelu(h, w, c, alpha_shape, zi, za, zo, ls, la, dl, seed):
    rng = np.random.default_rng(seed)
    ash = {"c": (c,), "1c": (1, c), "11c": (1, 1, c), "hwc": (h, w, c)}[alpha_shape]
    g = single_op("prelu", [("x", TensorType((1, h, w, c), "int8", q(2.0 ** ls, zi)), None),
                            ("alpha", TensorType(ash, "int8", q(2.0 ** la, za)), i8(rng, ash))], {},
                  q(2.0 ** (ls + dl), zo))
    got, want = compare(g, [i8(rng, (1, h, w, c))])
    assert_same(got, want, f"prelu alpha {ash}")


# ---- int8 unary: every one of the 256 codes ----------------------------------------------------------
@settings(**SETTINGS)
@given(op=st.sampled_from(["leaky_relu", "hard_swish", "abs", "exp", "rsqrt", "sqrt"]), zi=zp, zo=zp,
       ls=st.floats(-8.0, 0.0), dl=st.floats(-3.0, 3.0), alpha=st.floats(0.0, 2.0), same=st.booleans())
def test_int8_unary_all_codes(op, zi, zo, ls, dl, alpha, same):
    # LEAKY_RELU's alpha >= 0 here: with a negative alpha (a negative multiplier) LiteRT rounds some
    # ties the other way from TFLite Micro, which Kiln follows (docs/int8_ir.md)
    si = 2.0 ** ls
    so = si if same else 2.0 ** (ls + dl)
    if op == "hard_swish":
        so = max(so, si / 64)            # TFLite needs input scale / 128 <= output scale
    if op == "exp":
        so = 2.0 ** (dl * 2)
    x = np.arange(-128, 128, dtype=np.int64)
    if op in ("rsqrt", "sqrt"):
        x = x[x >= zi]                   # LiteRT's RSQRT and SQRT reject codes below the zero point
    x = x.astype(np.int8)
    attrs = {"alpha": alpha} if op == "leaky_relu" else {}
    g = single_op(op, [("x", TensorType(x.shape, "int8", q(si, zi)), None)], attrs, q(so, zo))
    got, want = compare(g, [x])
    assert_same(got, want, f"{op} si={si} so={so}")


def _litert_builtin(model, feeds):
    """LiteRT's builtin kernels without XNNPACK (ELU, CEIL, ROUND are not in the BUILTIN_REF resolver)."""
    interp = pytest.importorskip("ai_edge_litert.interpreter")
    it = interp.Interpreter(model_content=model, experimental_op_resolver_type=interp.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), feeds):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


NOT_IN_REF = ("ceil", "round", "elu")       # LiteRT registers these builtins outside BUILTIN_REF


def _oracle(g, feeds):
    if any(n.op in NOT_IN_REF for n in g.nodes):
        return _litert_builtin(export_tflite(g), feeds)
    return litert_run(export_tflite(g), feeds)


@settings(**SETTINGS)
@given(zi=zp, zo=zp, ls=st.floats(-8.0, 0.0), dl=st.floats(-3.0, 3.0))
def test_int8_elu_all_codes(zi, zo, ls, dl):
    x = np.arange(-128, 128, dtype=np.int64).astype(np.int8)
    g = single_op("elu", [("x", TensorType(x.shape, "int8", q(2.0 ** ls, zi)), None)], {}, q(2.0 ** (ls + dl), zo))
    assert_same(run(g, x)[0], _litert_builtin(export_tflite(g), [x])[0], "elu")


# ---- float ----------------------------------------------------------------------------------------
UNARY_F = ["abs", "neg", "sqrt", "rsqrt", "log", "exp", "square", "sin", "cos", "floor", "ceil", "round", "hard_swish",
           "leaky_relu"]
BINARY_F = ["sub", "div", "maximum", "minimum", "squared_difference", "prelu", "floor_div", "floor_mod"]
CMP = ["equal", "not_equal", "less", "less_equal", "greater", "greater_equal"]


def _float_feed(rng, op, shape):
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    if op in ("sqrt", "rsqrt", "log"):
        x = np.abs(x) + np.float32(0.05)
    if op in ("round", "floor", "ceil"):
        x.flat[: min(4, x.size)] = [0.5, 1.5, -2.5, -0.5][: min(4, x.size)]
    return x


@settings(**SETTINGS)
@given(op=st.sampled_from(UNARY_F + BINARY_F + CMP), shape=st.lists(st.integers(1, 5), min_size=1, max_size=4),
       alpha=st.floats(-1.0, 1.0), seed=st.integers(0, 2 ** 31))
def test_float_against_litert(op, shape, alpha, seed):
    rng = np.random.default_rng(seed)
    shape = tuple(shape)
    f32 = TensorType(shape, "float32")
    if op in UNARY_F:
        g = single_op(op, [("x", f32, None)], {"alpha": alpha} if op == "leaky_relu" else {}, None, "float32")
        feeds = [_float_feed(rng, op, shape)]
    else:
        s2 = _bshape(rng, shape)
        out = "bool" if op in CMP else "float32"
        g = single_op(op, [("a", f32, None), ("b", TensorType(s2, "float32"), None)], {}, None, out)
        b = (rng.standard_normal(s2) * 3).astype(np.float32)
        if op in ("div", "floor_div", "floor_mod"):
            b = np.where(np.abs(b) < 0.3, np.float32(0.7), b).astype(np.float32)
        a = (rng.standard_normal(shape) * 3).astype(np.float32)
        if op in CMP:
            a.flat[0] = b.flat[0]
        feeds = [a, b]
    got, want = run(g, *feeds)[0], _oracle(g, feeds)[0]
    assert got.dtype == want.dtype and got.shape == want.shape, op
    if op in ("floor_div", "floor_mod", "floor", "ceil", "round") or op in CMP:
        np.testing.assert_array_equal(got, want, err_msg=op)
    else:
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6, err_msg=op)


def test_float_logic_select_add_n_against_litert():
    rng = np.random.default_rng(3)
    g = Graph("logic")
    g.add_input("a", TensorType((3, 4), "bool"))
    g.add_input("b", TensorType((4,), "bool"))
    g.add_input("x", TensorType((3, 4)))
    g.add_input("y", TensorType((1, 4)))
    land = g.add_node("logical_and", ["a", "b"], name="land")
    lor = g.add_node("logical_or", ["a", "b"], name="lor")
    lnot = g.add_node("logical_not", ["a"], name="lnot")
    sel = g.add_node("where", ["land", "x", "y"], name="sel")
    addn = g.add_node("add_n", ["x", "sel", "x"], name="addn")
    g.outputs = [land, lor, lnot, sel, addn]
    feeds = [rng.random((3, 4)) < 0.5, rng.random(4) < 0.5, rng.standard_normal((3, 4)).astype(np.float32),
             rng.standard_normal((1, 4)).astype(np.float32)]
    want = litert_run(export_tflite(g), feeds)
    for name, w, gt in zip(g.outputs, want, run(g, *feeds)):
        np.testing.assert_array_equal(gt, w, err_msg=name)


def test_float_elu_against_litert():
    g = single_op("elu", [("x", TensorType((64,), "float32"), None)], {}, None, "float32")
    x = np.linspace(-6, 4, 64).astype(np.float32)
    np.testing.assert_allclose(run(g, x)[0], _litert_builtin(export_tflite(g), [x])[0], rtol=2e-6, atol=1e-7)


# ---- round trip ----------------------------------------------------------------------------------------
def _family_graph(int8):
    g = Graph("ew_family")
    qa, qb = (q(0.05, 3), q(0.04, -9)) if int8 else (None, None)
    dt = "int8" if int8 else "float32"
    g.add_input("x", TensorType((1, 4, 4, 3), dt, qa))
    g.add_input("y", TensorType((4, 1, 3), dt, qb))
    g.add_const("al", np.asarray([[[3, -20, 100]]], np.int8) if int8 else np.asarray([0.1, 0.2, -0.3], np.float32),
                q(0.01, 2) if int8 else None)
    ops = [("sub", ["x", "y"]), ("maximum", ["x", "x"]), ("minimum", ["x", "y"]), ("squared_difference", ["x", "y"]),
           ("prelu", ["x", "al"]), ("leaky_relu", ["x"]), ("hard_swish", ["x"]), ("abs", ["x"]), ("exp", ["x"])]
    if not int8:
        ops += [("div", ["x", "y"]), ("sin", ["x"]), ("floor_mod", ["x", "y"]), ("round", ["x"])]
    outs = []
    for k, (op, ins) in enumerate(ops):
        shape = np.broadcast_shapes(*[g.types[i].shape for i in ins])
        out_q = q(0.07 + 0.01 * k, k - 5) if int8 else None
        outs.append(g.add_node(op, ins, {"alpha": 0.25} if op == "leaky_relu" else {}, name=f"{op}_{k}",
                               out_type=TensorType(tuple(shape), dt, out_q)))
    g.outputs = outs
    return g


@pytest.mark.parametrize("int8", [False, True])
def test_export_import_round_trip(int8, tmp_path):
    g = _family_graph(int8)
    g2 = load_tflite(export_tflite(g))
    assert [n.op for n in g2.nodes] == [n.op for n in g.nodes]
    assert [n.attrs for n in g2.nodes] == [n.attrs for n in g.nodes]
    rng = np.random.default_rng(5)
    feeds = ([i8(rng, (1, 4, 4, 3)), i8(rng, (4, 1, 3))] if int8 else
             [rng.standard_normal((1, 4, 4, 3)).astype(np.float32), rng.uniform(0.5, 2, (4, 1, 3)).astype(np.float32)])
    want = _oracle(g, feeds)
    for name, a, b, w in zip(g.outputs, run(g, *feeds), run(g2, *feeds), want):
        np.testing.assert_array_equal(a, b, err_msg=name)
        if int8:
            np.testing.assert_array_equal(a, w, err_msg=name)
        else:
            np.testing.assert_allclose(a, w, rtol=2e-6, atol=1e-6, err_msg=name)


def test_import_refuses_int8_without_reference():
    g = single_op("sin", [("x", TensorType((4,), "float32"), None)], {}, None, "float32")
    data = bytearray(export_tflite(g))
    g8 = single_op("square", [("x", TensorType((4,), "int8", q(0.1, 0)), None)], {}, q(0.1, 0))
    from kiln.frontend.tflite_import import TFLiteImportError
    with pytest.raises(TFLiteImportError, match=r"operator 0 \(SQUARE\).*int8 SQUARE is not supported"):
        load_tflite(export_tflite(g8))
    assert load_tflite(bytes(data)).nodes[0].op == "sin"


# ---- int8 div, comparisons, select, log, neg ----------------------------------------------------
@settings(**SETTINGS)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=6), swap=st.booleans(), z1=zp, z2=zp, zo=zp,
       l1=log_scale, l2=log_scale, dl=st.floats(-3.0, 3.0), act=st.sampled_from(["none", "relu", "relu6"]),
       seed=st.integers(0, 2 ** 31))
def test_int8_div(shape, swap, z1, z2, zo, l1, l2, dl, act, seed):
    """Every numerator/denominator size, including small numerators over large divisors where
    TFLite's right shift reaches 32 or more."""
    rng = np.random.default_rng(seed)
    s1, s2 = tuple(shape), _bshape(rng, shape)
    if swap:
        s1, s2 = s2, s1
    lo = l1 - l2 + dl
    b = i8(rng, s2)
    b[b == z2] = np.int8(z2 + 1 if z2 < 127 else z2 - 1)
    g = Graph("div")
    g.add_input("a", TensorType(s1, "int8", q(2.0 ** l1, z1)))
    g.add_input("b", TensorType(s2, "int8", q(2.0 ** l2, z2)))
    oq = q(2.0 ** lo, zo)
    out_shape = np.broadcast_shapes(s1, s2)
    g.add_node("div", ["a", "b"], name="d", out_type=TensorType(out_shape, "int8", oq))
    if act != "none":
        g.add_node(act, ["d"], name="y", out_type=TensorType(out_shape, "int8", oq))
    g.outputs = [g.nodes[-1].name]
    try:
        got, want = compare(g, [i8(rng, s1), b])
    except kiln.frontend.errors.ShapeError as e:
        assert "too large" in str(e)          # multiplier out of TFLite's range: refused by name
        return
    assert_same(got, want, f"div {s1} {s2} {act}")


@settings(**SETTINGS)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=6), swap=st.booleans(), op=st.sampled_from(CMP),
       z1=zp, z2=zp, l1=st.floats(-9.0, -0.1), l2=st.floats(-9.0, -0.1), seed=st.integers(0, 2 ** 31))
def test_int8_comparisons(shape, swap, op, z1, z2, l1, l2, seed):
    rng = np.random.default_rng(seed)
    s1, s2 = tuple(shape), _bshape(rng, shape)
    if swap:
        s1, s2 = s2, s1
    if rng.random() < 0.3:
        l2, z2 = l1, z1                    # equal parameters: exact ties
    g = single_op(op, [("a", TensorType(s1, "int8", q(2.0 ** l1, z1)), None),
                       ("b", TensorType(s2, "int8", q(2.0 ** l2, z2)), None)], {}, None, "bool")
    got, want = compare(g, [i8(rng, s1), i8(rng, s2)])
    assert_same(got, want, f"{op} {s1} {s2}")


@settings(**SETTINGS)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=6), z=zp, ls=log_scale, seed=st.integers(0, 2 ** 31))
def test_int8_select_v2(shape, z, ls, seed):
    rng = np.random.default_rng(seed)
    shape = tuple(shape)
    sc, sb = _bshape(rng, shape), _bshape(rng, shape)
    g = single_op("where", [("c", TensorType(sc, "bool"), None), ("a", TensorType(shape, "int8", q(2.0 ** ls, z)), None),
                            ("b", TensorType(sb, "int8", q(2.0 ** ls, z)), None)], {}, q(2.0 ** ls, z))
    got, want = compare(g, [rng.random(sc) < 0.5, i8(rng, shape), i8(rng, sb)])
    assert_same(got, want, "select_v2")


@settings(**SETTINGS)
@given(op=st.sampled_from(["log", "neg"]), zi=zp, zo=zp, ls=st.floats(-8.0, 1.0), lo=st.floats(-8.0, 1.0))
def test_int8_log_neg_all_codes(op, zi, zo, ls, lo):
    x = np.arange(-128, 128, dtype=np.int64).astype(np.int8)
    g = single_op(op, [("x", TensorType(x.shape, "int8", q(2.0 ** ls, zi)), None)], {}, q(2.0 ** lo, zo))
    got, want = compare(g, [x])
    assert_same(got, want, op)


@pytest.mark.parametrize("op", ["sub", "div"])
@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_fused_activation_survives_export(op, dtype):
    """SUB and DIV carry their fused activation in their options (a relu after them is fused on
    export): the options table must be written for every dtype, not only int16 SUB's."""
    from kiln.frontend.tflite_import import load_tflite
    from kiln.quantize.tflite_export import export_tflite
    qq = q(0.5, 0) if dtype == "int8" else None
    g = Graph(op)
    g.add_input("a", TensorType((3,), dtype, qq))
    g.add_input("b", TensorType((3,), dtype, qq))
    g.add_node(op, ["a", "b"], name="d", out_type=TensorType((3,), dtype, qq))
    g.add_node("relu", ["d"], name="y", out_type=TensorType((3,), dtype, qq))
    g.outputs = ["y"]
    assert [n.op for n in load_tflite(export_tflite(g)).nodes] == [op, "relu"]
