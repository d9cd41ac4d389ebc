"""The element-wise family through the C backend on the host: every int8 kernel bit-exact with
Kiln's int8 reference (broadcasting operands, several quantisations), every float op through its
TE compute within 1e-5 of NumPy."""
import dataclasses

import numpy as np
import pytest

import kiln.quantize  # noqa: F401  (int8 references)
from kiln.backends import compile as compile_pkg
from kiln.backends import cpus
from kiln.backends.cpus import TARGETS
from kiln.frontend import Graph, QParams, TensorType, run

RNG = np.random.default_rng(11)


def q(scale, zp):
    return QParams((float(np.float32(scale)),), (int(zp),))


def i8(shape):
    return RNG.integers(-128, 128, size=shape).astype(np.int8)


def int8_graph():
    g = Graph("ew_int8")
    g.add_input("x", TensorType((2, 3, 5, 4), "int8", q(0.05, 3)))
    g.add_input("y", TensorType((5, 1), "int8", q(0.031, -20)))
    g.add_input("p", TensorType((2, 3, 5, 4), "int8", q(0.02, -128)))      # rsqrt: codes >= zero point
    g.add_const("alpha", i8((1, 1, 4)), q(0.004, 5))
    nodes = [
        ("sub", ["x", "y"], {}, q(0.09, -4)), ("sub", ["y", "x"], {}, q(0.02, 60)),
        ("squared_difference", ["x", "y"], {}, q(0.2, -100)), ("maximum", ["x", "x"], {}, q(0.05, 3)), ("maximum", ["y", "x"], {}, q(0.05, 3)),
        ("minimum", ["x", "y"], {}, q(0.05, 3)), ("prelu", ["x", "alpha"], {}, q(0.04, -10)),
        ("leaky_relu", ["x"], {"alpha": 0.1}, q(0.03, -50)), ("leaky_relu", ["x"], {"alpha": 1.5}, q(0.08, 7)),
        ("hard_swish", ["x"], {}, q(0.04, -60)), ("abs", ["x"], {}, q(0.05, -128)), ("abs", ["x"], {}, q(0.02, -100)),
        ("rsqrt", ["p"], {}, q(0.1, -110)), ("exp", ["x"], {}, q(0.2, -128)), ("elu", ["x"], {}, q(0.03, 40)),
        ("log", ["x"], {}, q(0.05, 90)), ("neg", ["x"], {}, q(0.05, 3)), ("sqrt", ["p"], {}, q(0.01, -128)),
        ("div", ["x", "y"], {}, q(0.1, 5)), ("div", ["y", "x"], {}, q(0.05, -3)), ("div", ["x", "x"], {}, q(0.3, -100)),
    ]
    outs = []
    for k, (op, ins, attrs, oq) in enumerate(nodes):
        shape = np.broadcast_shapes(*[g.types[i].shape for i in ins])
        outs.append(g.add_node(op, ins, attrs, name=f"{op}_{k}", out_type=TensorType(tuple(shape), "int8", oq)))
    g.outputs = outs
    return g


# Kiln's kernels for the host and the M3; "plain": TVM's default schedules
@pytest.mark.parametrize("target", ["host", "cortex-m3", "plain"])
def test_int8_kernels_bit_exact_on_host(target, tmp_path):
    g = int8_graph()
    if target == "plain":
        target = dataclasses.replace(cpus.get("cortex-m3"), kernels=False)
    pkg = compile_pkg(g, target=target, out_dir=tmp_path, plot=False, measure_size=False)
    for _ in range(3):
        feeds = [i8((2, 3, 5, 4)), i8((5, 1)), i8((2, 3, 5, 4))]
        feeds[0][feeds[0] == 3] = 4             # divisors away from their zero points (TFLite: undefined)
        feeds[1][feeds[1] == -20] = -21
        for name, want, got in zip(g.outputs, run(g, *feeds), pkg.run(*feeds)):
            assert got.dtype == want.dtype == np.int8, name
            np.testing.assert_array_equal(got, want, err_msg=name)


def float_graph():
    g = Graph("ew_float")
    g.add_input("x", TensorType((2, 3, 5, 4)))
    g.add_input("y", TensorType((5, 1)))
    g.add_input("p", TensorType((2, 3, 5, 4)))
    g.add_const("alpha", RNG.uniform(0, 0.5, (1, 1, 4)).astype(np.float32))
    nodes = [("abs", ["x"], {}), ("square", ["x"], {}), ("rsqrt", ["p"], {}), ("sin", ["x"], {}), ("cos", ["x"], {}),
             ("floor", ["x"], {}), ("ceil", ["x"], {}), ("round", ["x"], {}), ("elu", ["x"], {}),
             ("hard_swish", ["x"], {}), ("leaky_relu", ["x"], {"alpha": 0.3}), ("prelu", ["x", "alpha"], {}),
             ("squared_difference", ["x", "y"], {}), ("floor_div", ["x", "y"], {}), ("floor_mod", ["x", "y"], {}),
             ("add_n", ["x", "p", "x"], {}), ("sub", ["x", "y"], {}), ("div", ["x", "y"], {})]
    g.outputs = [g.add_node(op, ins, attrs, name=f"{op}_{k}") for k, (op, ins, attrs) in enumerate(nodes)]
    return g


def test_float_ops_through_te_on_host(tmp_path):
    g = float_graph()
    pkg = compile_pkg(g, target="host", out_dir=tmp_path, plot=False, measure_size=False)
    x = (RNG.standard_normal((2, 3, 5, 4)) * 3).astype(np.float32)
    x[0, 0, 0, :3] = [0.5, 1.5, -2.5]                       # round half to even
    y = RNG.choice([-1.5, -0.7, 0.9, 2.0], (5, 1)).astype(np.float32)
    p = RNG.uniform(0.1, 4, (2, 3, 5, 4)).astype(np.float32)
    for name, want, got in zip(g.outputs, run(g, x, y, p), pkg.run(x, y, p)):
        assert got.shape == want.shape, name
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=name)
    assert run(g, x, y, p)[g.outputs.index("round_7")][0, 0, 0, :3].tolist() == [0.0, 2.0, -2.0]


@pytest.mark.parametrize("op", ["sin", "floor_mod"])
def test_int8_op_without_int8_reference_is_refused(op, tmp_path):
    """An op TFLite computes only in float is not run on int8 codes by its float compute."""
    from kiln.backends.lower import LoweringError
    g = Graph("bad")
    g.add_input("a", TensorType((4,), "int8", q(0.1, 0)))
    ins = ["a"] if op == "sin" else ["a", "a"]
    g.add_node(op, ins, name="here", out_type=TensorType((4,), "int8", q(0.1, 0)))
    g.outputs = ["here"]
    with pytest.raises(LoweringError, match="here"):
        compile_pkg(g, target="host", out_dir=tmp_path, measure_size=False)


@pytest.mark.parametrize("scales", [(0.05, 3, 0.03, -7, 0.1, 5), (0.5, -100, 0.003, 17, 0.9, -3),
                                    (0.002, 127, 0.4, -128, 0.00001, 0)])
def test_int8_div_every_code_pair_on_host(scales, tmp_path):
    """All 256 x 255 (numerator, divisor) codes: TFLite's reciprocal tables, headroom and its
    shifts of 32 or more in C equal the int8 reference."""
    s1, z1, s2, z2, so, zo = scales
    a = np.repeat(np.arange(-128, 128), 256).astype(np.int8)
    b = np.tile(np.arange(-128, 128), 256).astype(np.int8)
    keep = b != z2
    a, b = a[keep], b[keep]
    g = Graph("div_all")
    g.add_input("a", TensorType(a.shape, "int8", q(s1, z1)))
    g.add_input("b", TensorType(b.shape, "int8", q(s2, z2)))
    g.outputs = [g.add_node("div", ["a", "b"], name="d", out_type=TensorType(a.shape, "int8", q(so, zo)))]
    pkg = compile_pkg(g, target="host", out_dir=tmp_path, plot=False, measure_size=False)
    np.testing.assert_array_equal(pkg.run(a, b)[0], run(g, a, b)[0])


@pytest.mark.parametrize("op", ["sub", "squared_difference", "maximum", "div"])
def test_int8_six_d_broadcast_on_host(op, tmp_path):
    g = Graph("six_d")
    g.add_input("a", TensorType((2, 1, 3, 1, 2, 2), "int8", q(0.05, 3)))
    g.add_input("b", TensorType((2, 1, 3, 1, 2), "int8", q(0.03, -7)))
    g.outputs = [g.add_node(op, ["a", "b"], name="y", out_type=TensorType((2, 2, 3, 3, 2, 2), "int8", q(0.2, 1)))]
    pkg = compile_pkg(g, target="host", out_dir=tmp_path, plot=False, measure_size=False)
    a, b = i8((2, 1, 3, 1, 2, 2)), i8((2, 1, 3, 1, 2))
    b[b == -7] = -8
    np.testing.assert_array_equal(pkg.run(a, b)[0], run(g, a, b)[0])


@pytest.mark.slow
@pytest.mark.parametrize("target", sorted(t for t in TARGETS if t != "host"))
def test_family_cross_compiles_warning_free(target, tmp_path):
    """Every int8 and float kernel of the family builds with -Wall -Wextra -Werror for each core."""
    for make in (int8_graph, float_graph):
        pkg = compile_pkg(make(), target=target, out_dir=tmp_path / make.__name__, plot=False)
        assert pkg.manifest.sizes["code_bytes"] > 0
