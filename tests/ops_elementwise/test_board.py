"""An int8 model made of the element-wise family on the emulated Cortex-M4 board (QEMU
mps2-an386): the firmware's outputs equal LiteRT's reference kernels (the golden pairs) and
Kiln's int8 reference, bit for bit."""
import numpy as np
import pytest

import kiln.quantize  # noqa: F401
from kiln.frontend import Graph, QParams, TensorType, load_model, run
from kiln.quantize.tflite_export import export_tflite


def q(scale, zp):
    return QParams((float(np.float32(scale)),), (int(zp),))


def family_model():
    """sub, squared_difference, maximum, minimum, prelu, leaky_relu, hard_swish, abs, rsqrt, exp,
    log, neg, sqrt and div, broadcasting where TFLite allows it; every intermediate is an output."""
    rng = np.random.default_rng(4)
    g = Graph("ew_board")
    g.add_input("x", TensorType((1, 4, 5, 3), "int8", q(0.05, 3)))
    g.add_input("y", TensorType((5, 1), "int8", q(0.01, -20)))
    g.add_const("alpha", rng.integers(-128, 128, (1, 1, 3)).astype(np.int8), q(0.004, 5))

    def node(op, ins, oq, **attrs):
        shape = np.broadcast_shapes(*[g.types[i].shape for i in ins])
        return g.add_node(op, ins, attrs, name=f"{op}_{len(g.nodes)}", out_type=TensorType(tuple(shape), "int8", oq))
    d = node("sub", ["x", "y"], q(0.06, -4))
    outs = [d, node("squared_difference", ["x", "y"], q(0.02, -100)), node("maximum", [d, "x"], q(0.06, -4)),
            node("minimum", ["x", "y"], q(0.05, 3)),
            node("prelu", ["x", "alpha"], q(0.04, -10)), node("leaky_relu", [d], q(0.03, -50), alpha=0.1),
            node("hard_swish", ["x"], q(0.04, -60)), node("abs", [d], q(0.03, -128)),
            node("log", ["x"], q(0.05, 90)), node("neg", ["x"], q(0.05, 3))]
    e = node("exp", ["y"], q(0.02, -128))             # y in [-1.1, 1.5]: exp(y) never codes to -128
    outs += [e, node("rsqrt", [e], q(0.03, -100)), node("sqrt", [e], q(0.01, -128)), node("div", [d, e], q(0.1, 5))]
    g.outputs = outs
    return g


@pytest.mark.slow
@pytest.mark.qemu
def test_family_model_bit_exact_on_mps2_an386(tmp_path):
    from kiln.commands.golden import golden
    from kiln.commands.verify import load_golden, verify
    from kiln.samples import random_inputs
    g = family_model()
    path = str(tmp_path / "ew_board.tflite")
    export_tflite(g, path)
    samples = random_inputs(load_model(path), 3, seed=9)
    gold = str(tmp_path / "g.npz")
    assert golden(path, gold, samples) == "litert"          # LiteRT's BUILTIN_REF computes the goldens
    pairs = load_golden(gold)
    for inputs, wants in pairs:                            # Kiln's int8 reference equals LiteRT
        for name, got, want in zip(g.outputs, run(load_model(path), *inputs), wants):
            np.testing.assert_array_equal(got, want, err_msg=name)
    rep = verify(path, gold, "mps2-an386", options={"out": str(tmp_path / "board")})
    assert rep["ok"] and rep["matched"] == 3, rep["results"]
