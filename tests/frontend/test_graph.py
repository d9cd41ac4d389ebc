"""The graph IR: SSA validation naming the node at fault, rendering, copies."""
import numpy as np
import pytest

import kiln.frontend as kf
from kiln.frontend.errors import GraphError, ShapeError
from kiln.frontend.types import QParams, TensorType


def _g():
    g = kf.Graph("g")
    g.add_input("x", TensorType((2, 3), "float32"))
    g.add_param("w", np.ones((3, 4), np.float32))
    g.add_const("c", np.float32(2.0))
    g.add_node("matmul", ["x", "w"], name="y")
    g.add_node("mul", ["y", "c"], name="z")
    g.outputs = ["z"]
    return g


def test_valid_graph_and_queries():
    g = _g().validate()
    assert [g.kind(v) for v in ("x", "w", "c", "y")] == ["input", "param", "const", "node"]
    assert g.producer("y").op == "matmul" and g.producer("x") is None
    assert g.last_use() == {"x": 0, "w": 0, "y": 1, "c": 1, "z": 2}
    assert [n.name for n in g.consumers()["y"]] == ["z"]
    assert g.depth() == 2
    np.testing.assert_array_equal(kf.run(g, np.ones((2, 3), np.float32))[0], np.full((2, 4), 6.0))


@pytest.mark.parametrize("mutate,err,message", [
    (lambda g: g.nodes.reverse(), GraphError, r"node 0 'z' \(mul\): input 'y' is used before it is defined"),
    (lambda g: g.nodes.append(g.nodes[0]), GraphError, "defined twice"),
    (lambda g: g.nodes[1].inputs.append("c"), GraphError, "expects 2 inputs, got 3"),
    (lambda g: g.nodes[0].attrs.update(foo=1), GraphError, "has no attribute 'foo'"),
    (lambda g: setattr(g.nodes[1], "op", "nope"), GraphError, "unknown op 'nope'"),
    (lambda g: g.types.update(z=TensorType((2, 5), "float32")), GraphError, r"recorded type float32\[2,5\] but the shape rule gives float32\[2,4\]"),
    (lambda g: g.params.update(w=np.ones((3, 4))), GraphError, "tensor 'w' holds float64"),
    (lambda g: g.outputs.append("nowhere"), GraphError, "graph output 'nowhere' is not defined"),
    (lambda g: g.updates.update(c="nowhere"), GraphError, "buffer update"),
    (lambda g: g.types.update(w=TensorType((4, 4), "float32")) or g.params.update(w=np.ones((4, 4), np.float32)),
     ShapeError, r"node 0 'y' \(matmul\): matmul: inner dimensions differ"),
])
def test_validate_names_the_fault(mutate, err, message):
    g = _g()
    mutate(g)
    with pytest.raises(err, match=message):
        g.validate()


def test_add_node_checks_eagerly():
    g = _g()
    with pytest.raises(GraphError, match="not defined before it is used"):
        g.add_node("neg", ["q"])
    with pytest.raises(GraphError, match="defined twice"):
        g.add_node("neg", ["x"], name="y")
    with pytest.raises(GraphError, match=r"attribute 'axes' of 'sum' must be ints"):
        g.add_node("sum", ["x"], {"axes": "0"})
    with pytest.raises(GraphError, match=r"attribute 'activation' of 'dense' must be one of"):
        g.add_node("dense", ["x", "x"], {"activation": "gelu"})
    with pytest.raises(GraphError, match="needs attribute"):
        from kiln.frontend.registry import REQUIRED, Attr, get_op
        op = get_op("neg")
        op.attrs["k"] = Attr("int", REQUIRED)
        try:
            g.add_node("neg", ["x"])
        finally:
            del op.attrs["k"]


def test_copy_is_independent():
    g = _g()
    c = g.copy()
    c.add_node("neg", ["z"], name="n")
    c.nodes[0].attrs["x"] = 1
    assert len(g.nodes) == 2 and "n" not in g.types and g.nodes[0].attrs == {}
    assert c.producer("n").op == "neg" and c.producer("y").op == "matmul"


def test_pretty_and_dot():
    g = _g()
    s = g.pretty()
    assert "graph g(x: float32[2,3])" in s and "y = matmul(x, w)  # float32[2,4]" in s and "return z" in s
    dot = g.to_dot()
    assert dot.startswith('digraph "g"') and '"y" -> "z";' in dot


def test_types_and_quant_params():
    t = TensorType((2, 3), "int8", QParams(0.5, 3))
    assert str(t) == "int8[2,3]{q s=0.5 zp=3}" and t.nbytes == 6
    assert TensorType.from_json(t.to_json()) == t
    pc = TensorType((4, 2), "int8", QParams([0.1, 0.2], [0, 0], axis=0))
    assert TensorType.from_json(pc.to_json()) == pc and "axis=0" in str(pc)
    with pytest.raises(ShapeError, match="per-tensor"):
        QParams([0.1, 0.2], [0, 0])
    with pytest.raises(ShapeError, match="negative dimension"):
        TensorType((-1,))
    with pytest.raises(ShapeError, match="unknown dtype"):
        TensorType((1,), "complex64")
