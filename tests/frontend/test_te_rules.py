"""Every op's one float lowering (its TE compute, ``OpDef.te``) and MAC count (``OpDef.macs``)
live with the op's definition; importing the frontend never loads TVM."""
import subprocess
import sys

import pytest

from kiln.frontend.registry import LINEAR, OPS
from kiln.frontend.types import TensorType

# ops with no TE compute, and why
NO_TE = {
    "dropout": "its mask comes from NumPy's generator on the host (tvm_te.externalize_dropout)",
    "quantize": "int8: the C backend's own kernel",
    "dequantize": "int8: the C backend's own kernel",
    "fake_quant": "QAT's quantise-dequantise round trip: the NumPy executor runs it",
    "detection_postprocess": "sorting and NMS: the C backend's own kernel (backends/ops_detection.py, kiln_detect.h)",
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_has_a_te_lowering_next_to_its_definition(name):
    op = OPS[name]
    if name in NO_TE:
        assert op.te is None, f"'{name}' now has a TE compute: remove it from NO_TE"
        return
    assert op.te is not None, f"op '{name}' has no TE lowering"
    assert op.te.__module__ == op.infer.__module__, \
        f"the TE compute of '{name}' is in {op.te.__module__}, its definition in {op.infer.__module__}"


def test_importing_kiln_does_not_import_tvm():
    code = "import sys, kiln, kiln.frontend.ops; sys.exit(1 if 'tvm' in sys.modules else 0)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr or "import kiln loaded TVM"


def _t(*shape):
    return TensorType(tuple(shape), "float32")


CONV = dict(stride=[1, 1], padding="same", dilation=[1, 1], groups=1, activation="none")


@pytest.mark.parametrize("op,ins,out,attrs,want", [
    # N * oh * ow * O * KH * KW * (C_in / groups)
    ("conv2d", [_t(2, 8, 8, 3), _t(16, 3, 3, 3)], _t(2, 8, 8, 16), CONV, 2 * 8 * 8 * 16 * 3 * 3 * 3),
    ("conv2d", [_t(1, 8, 8, 4), _t(8, 3, 3, 1)], _t(1, 4, 4, 8), dict(CONV, groups=4, stride=[2, 2]),
     1 * 4 * 4 * 8 * 3 * 3 * 1),                                  # depthwise, multiplier 2
    ("conv2d", [_t(1, 5, 5, 6), _t(4, 1, 1, 3)], _t(1, 5, 5, 4), dict(CONV, groups=2), 5 * 5 * 4 * 3),
    ("conv2d_grad_input", [_t(2, 8, 8, 16), _t(16, 3, 3, 3)], _t(2, 8, 8, 3), dict(CONV, input_shape=[2, 8, 8, 3]),
     2 * 8 * 8 * 16 * 3 * 3 * 3),
    ("conv2d_grad_weight", [_t(2, 8, 8, 3), _t(2, 8, 8, 16)], _t(16, 3, 3, 3),
     dict(CONV, weight_shape=[16, 3, 3, 3]), 2 * 8 * 8 * 16 * 3 * 3 * 3),
    ("dense", [_t(4, 10), _t(7, 10), _t(7)], _t(4, 7), {"activation": "relu"}, 4 * 7 * 10),
    ("matmul", [_t(3, 1, 5, 6), _t(2, 6, 4)], _t(3, 2, 5, 4), {}, 3 * 2 * 5 * 4 * 6),
])
def test_macs_rule(op, ins, out, attrs, want):
    assert OPS[op].macs(ins, out, attrs) == want


def test_macs_rules_cover_the_linear_ops():
    assert {n for n, op in OPS.items() if LINEAR in op.props} <= {n for n, op in OPS.items() if op.macs}
