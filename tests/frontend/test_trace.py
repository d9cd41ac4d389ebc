"""Tracing: data-dependent control flow is a TraceError naming the user's file and line; in-place
operators create new nodes; indexing, literals and return conventions."""
import inspect

import numpy as np
import pytest

import kiln.frontend as kf
from kiln.frontend import functional as F
from kiln.frontend.errors import ShapeError, TraceError
from kiln.frontend.types import TensorType

HERE = __file__


def _branch_on_sum(x):
    if x.sum() > 0:
        return x
    return -x


def _bool(x):
    return x * 2.0 if bool(x[0]) else x


def _float(x):
    return x * float(x.sum())


def _int(x):
    return x * int(x[0])


def _while(x):
    while (x.max() < 10.0):
        x = x * 2.0
    return x


def _index_with_tensor(x):
    return x[x.sum()]


def _numpy_conversion(x):
    return np.asarray(x) + 1


def _item(x):
    return x * x.sum().item()


def _line_of(fn, text):
    src, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(src) if text in line)


@pytest.mark.parametrize("fn,what,marker", [
    (_branch_on_sum, "bool()", "if x.sum() > 0"),
    (_bool, "bool()", "bool(x[0])"),
    (_float, "float()", "float(x.sum())"),
    (_int, "int()", "int(x[0])"),
    (_while, "bool()", "while ("),
    (_index_with_tensor, "use as an index", "x[x.sum()]"),
    (_numpy_conversion, "conversion to a NumPy array", "np.asarray"),
    (_item, ".item()", ".item()"),
])
def test_data_dependent_control_flow_names_user_file_and_line(fn, what, marker):
    with pytest.raises(TraceError) as e:
        kf.trace(fn, (3,))
    msg = str(e.value)
    assert what in msg
    assert f"{HERE}:{_line_of(fn, marker)}" in msg, msg
    assert "kiln.where" in msg          # says what to do instead


def test_where_is_the_data_dependent_alternative():
    g = kf.trace(lambda x: F.where(x.sum() > 0.0, x, -x), (3,))
    np.testing.assert_array_equal(kf.run(g, np.array([-1, -2, 1], np.float32))[0], [1, 2, -1])


def test_inplace_operators_create_new_nodes():
    seen = {}

    def f(x, y):
        z = x
        z += y
        seen["after_add"] = z
        z *= 2.0
        z -= x
        z /= y
        seen["x"], seen["z"] = x, z
        return z
    g = kf.trace(f, (3,), (3,))
    assert [n.op for n in g.nodes] == ["add", "mul", "sub", "div"]
    assert seen["x"].name == "x0" and seen["after_add"].name != "x0"   # x itself was not mutated
    x, y = np.array([1.0, 2.0, 3.0], np.float32), np.array([2.0, 4.0, 8.0], np.float32)
    np.testing.assert_allclose(kf.run(g, x, y)[0], ((x + y) * 2 - x) / y)


def test_every_node_is_ssa():
    def f(x):
        for _ in range(3):
            x += 1.0
        return x
    g = kf.trace(f, (2,))
    assert len({n.name for n in g.nodes}) == len(g.nodes) == 3


def test_literals_and_numpy_values_become_constants():
    g = kf.trace(lambda x: np.float32(2.0) * x + np.arange(3, dtype=np.float32) - 1, (3,))
    assert len(g.consts) == 3
    np.testing.assert_array_equal(kf.run(g, np.ones(3, np.float32))[0], [1, 2, 3])
    gi = kf.trace(lambda i: i * 3 + 1, TensorType((2,), "int32"))
    assert gi.types[gi.outputs[0]].dtype == "int32"
    np.testing.assert_array_equal(kf.run(gi, np.array([1, 2], np.int32))[0], [4, 7])


def test_float64_trace_keeps_float64_literals():
    g = kf.trace(lambda x: x * 0.1, TensorType((1,), "float64"))
    assert all(v.dtype == np.float64 for v in g.consts.values())


def test_getitem_forms():
    x = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    for idx in [(1,), (slice(None), 2), (-1, slice(1, 3), slice(None, None, 2)), (Ellipsis, 4),
                (slice(2, 1),), (slice(0, 10),), (1, Ellipsis, slice(-2, None))]:
        g = kf.trace(lambda t, idx=idx: t[idx] * 1.0, (3, 4, 5))
        np.testing.assert_array_equal(kf.run(g, x)[0], x[idx], err_msg=str(idx))
    with pytest.raises(IndexError):
        kf.trace(lambda t: t[3], (3, 4, 5))
    with pytest.raises(TraceError, match="negative slice steps"):
        kf.trace(lambda t: t[::-1], (3,))


def test_outputs_tuple_list_and_dict():
    g = kf.trace(lambda x: (x + 1.0, x * 2.0), (2,))
    assert len(g.outputs) == 2
    g = kf.trace(lambda x: {"a": x + 1.0, "b": x * 2.0}, (2,))
    assert g.meta["output_names"] == ["a", "b"] and len(g.outputs) == 2


def test_returning_a_non_tensor_is_an_error():
    with pytest.raises(TraceError, match="returned int"):
        kf.trace(lambda x: 3, (2,))


def test_ops_outside_trace_say_so():
    with pytest.raises(TraceError, match="inside kiln.trace"):
        F.exp(1.0)


def test_shape_errors_name_the_node_and_op():
    with pytest.raises(ShapeError, match=r"\(add\).*do not broadcast"):
        kf.trace(lambda a, b: a + b, (2, 3), (4,))
    with pytest.raises(ShapeError, match=r"\(matmul\).*inner dimensions"):
        kf.trace(lambda a, b: a @ b, (2, 3), (4, 2))
    with pytest.raises(ShapeError, match="one dtype"):
        kf.trace(lambda a, b: a + b, TensorType((2,), "float32"), TensorType((2,), "float64"))


def test_input_specs():
    g = kf.trace(lambda a, b, c: a + F.cast(b, "float32") + F.cast(c, "float32"),
                 (2,), TensorType((2,), "int32"), np.zeros(2, np.int64), input_names=["a", "b", "c"])
    assert [str(g.types[i]) for i in g.inputs] == ["float32[2]", "int32[2]", "int64[2]"]


def test_parameter_and_tensor_operators():
    class M(kf.Module):
        def __init__(self):
            self.p = kf.Parameter(np.array([1.0, -2.0]))

        def forward(self, x):
            return (2.0 / self.p + abs(x) + abs(self.p) - self.p * x + (x - self.p) / self.p
                    + self.p ** 2.0 + self.p[0] + self.p.T + self.p.sum() + 1.0 - self.p)
    x = np.array([3.0, -4.0], np.float32)
    p = np.array([1.0, -2.0], np.float32)
    want = 2 / p + abs(x) + abs(p) - p * x + (x - p) / p + p ** 2 + p[0] + p + p.sum() + 1 - p
    np.testing.assert_allclose(kf.run(kf.trace(M(), (2,)), x)[0], want, rtol=1e-6)
