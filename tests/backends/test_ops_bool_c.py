"""Bool tensors through the C backend: the comparisons (float, and int8 with TFLite's rescaling),
LOGICAL_AND/OR/NOT, SELECT_V2 with a bool condition (float and int8 values), CAST to and from bool,
and a bool graph input. One model per dtype, exported to .tflite: LiteRT's reference kernels, Kiln's
reference, the host C package and (slow) the mps2-an386 firmware agree element for element."""
import numpy as np
import pytest

import kiln.quantize  # noqa: F401
from kiln.backends import compile as compile_pkg
from kiln.frontend import Graph, QParams, TensorType, run
from kiln.quantize.tflite_export import export_tflite
from tests.quantize.litert_util import assert_same, litert_run

CMPS = ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal")
SHAPE = (2, 3, 4)


def _q(scale, zp):
    return QParams((float(np.float32(scale)),), (int(zp),))


def bool_model(dtype, sa=0.05, za=3, sb=0.07, zb=-10, bool_input=True):
    """a [2,3,4], b [3,4] (broadcast), m bool [2,3,4] -> the six comparisons, and/or/not, where
    (a or a constant), casts bool -> float32 / int32 and float32 -> bool. ``bool_input=False``: m
    is not_equal(a, b) instead (Kiln's .tflite importer takes float32 and integer graph inputs)."""
    qa, qb = (_q(sa, za), _q(sb, zb)) if dtype == "int8" else (None, None)
    g = Graph(f"bool_{dtype}")
    g.add_input("a", TensorType(SHAPE, dtype, qa))
    g.add_input("b", TensorType(SHAPE[1:], dtype, qb))
    if bool_input:
        g.add_input("m", TensorType(SHAPE, "bool"))
    rng = np.random.default_rng(9)
    other = rng.integers(-128, 128, SHAPE) if dtype == "int8" else rng.standard_normal(SHAPE)
    g.add_const("other", other.astype(dtype), qa)
    b = TensorType(SHAPE, "bool")
    for op in CMPS:
        g.add_node(op, ["a", "b"], {}, name=op, out_type=b)
    g.add_node("logical_and", ["less", "m" if bool_input else "not_equal"], {}, name="land", out_type=b)
    g.add_node("logical_or", ["greater", "equal"], {}, name="lor", out_type=b)
    g.add_node("logical_not", ["lor"], {}, name="lnot", out_type=b)
    g.add_node("where", ["land", "a", "other"], {}, name="sel", out_type=TensorType(SHAPE, dtype, qa))
    g.add_node("cast", ["lnot"], {"dtype": "float32"}, name="to_float", out_type=TensorType(SHAPE, "float32"))
    g.add_node("cast", ["lnot"], {"dtype": "int32"}, name="to_int", out_type=TensorType(SHAPE, "int32"))
    g.add_node("cast", ["to_float"], {"dtype": "bool"}, name="from_float", out_type=b)
    g.outputs = list(CMPS) + ["land", "lor", "lnot", "sel", "to_float", "to_int", "from_float"]
    return g


def feeds(dtype, rng):
    if dtype == "int8":
        a = rng.integers(-128, 128, SHAPE).astype(np.int8)
        b = rng.integers(-128, 128, SHAPE[1:]).astype(np.int8)
    else:                                   # small integers: many ties, so equal/less_equal matter
        a = rng.integers(-3, 4, SHAPE).astype(np.float32)
        b = rng.integers(-3, 4, SHAPE[1:]).astype(np.float32)
    return [a, b, rng.random(SHAPE) < 0.5]


@pytest.mark.parametrize("dtype,scales", [
    ("float32", {}),
    ("int8", {}),
    ("int8", dict(sa=0.02, za=-128, sb=0.02, zb=-128)),      # equal quantisation: exact ties
    ("int8", dict(sa=0.5, za=0, sb=0.25, zb=0)),             # codes on a 2:1 grid: ties across scales
])
def test_bool_ops_reference_and_host_c_match_litert(dtype, scales, tmp_path):
    g = bool_model(dtype, **scales)
    model = export_tflite(g)
    pkg = compile_pkg(g, target="host", out_dir=tmp_path, plot=False, measure_size=False)
    rng = np.random.default_rng(len(str(scales)))
    for _ in range(3):
        xs = feeds(dtype, rng)
        want = litert_run(model, xs)
        for name, ref, host, w in zip(g.outputs, run(g, *xs), pkg.run(*xs), want):
            assert_same(ref, w, f"{dtype} {name} reference")
            assert_same(host, w, f"{dtype} {name} host C")


def test_bool_graph_output_of_a_data_movement_op(tmp_path):
    """A bool tensor through a reshape (a raw byte copy) as the kernel's output."""
    g = Graph("bool_reshape")
    g.add_input("x", TensorType((2, 6), "float32"))
    g.add_const("x0", np.zeros((), np.float32))
    g.add_node("greater", ["x", "x0"], {}, name="gt", out_type=TensorType((2, 6), "bool"))
    g.add_node("reshape", ["gt"], {"shape": [3, 4]}, name="r", out_type=TensorType((3, 4), "bool"))
    g.outputs = ["r"]
    pkg = compile_pkg(g, target="host", out_dir=tmp_path, plot=False, measure_size=False)
    x = np.random.default_rng(0).standard_normal((2, 6)).astype(np.float32)
    np.testing.assert_array_equal(pkg.run(x)[0], (x > 0).reshape(3, 4))


@pytest.mark.parametrize("dtype", ["bool", "float32", "int32"])
def test_cast_of_a_quantised_tensor_converts_the_codes(dtype, tmp_path):
    """TFLite's CAST ignores quantisation: int8 -> bool is code != 0, int8 -> float32 the code."""
    g = Graph("cast_codes")
    g.add_input("a", TensorType((2, 5), "int8", _q(0.05, 3)))
    g.add_node("cast", ["a"], {"dtype": dtype}, name="y", out_type=TensorType((2, 5), dtype))
    g.outputs = ["y"]
    x = np.array([[-128, -1, 0, 1, 3], [127, 2, -3, 0, 5]], np.int8)
    want = litert_run(export_tflite(g), [x])[0]
    pkg = compile_pkg(g, target="host", out_dir=tmp_path, plot=False, measure_size=False)
    assert_same(run(g, x)[0], want, "reference")
    assert_same(pkg.run(x)[0], want, "host C")


@pytest.mark.slow
@pytest.mark.qemu
@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_bool_ops_on_board(dtype, tmp_path):
    from kiln.commands.golden import golden
    from kiln.commands.verify import verify
    path = tmp_path / f"bool_{dtype}.tflite"
    path.write_bytes(export_tflite(bool_model(dtype, bool_input=False)))
    rng = np.random.default_rng(4)
    samples = [feeds(dtype, rng)[:2] for _ in range(2)]
    gold = str(tmp_path / "g.npz")
    golden(str(path), gold, samples)
    rep = verify(str(path), gold, "mps2-an386", options={"out": str(tmp_path / "board")})
    assert rep["ok"] and rep["matched"] == 2, rep["results"]
