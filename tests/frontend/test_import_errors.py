"""Import errors a PyTorch / ONNX user understands: a graph break or an unsupported ATen op names
the op and the Python source line torch.export recorded; an unsupported ONNX op or attribute names
the op, the node and the opset."""
import inspect
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper  # noqa: E402

from kiln.frontend import load_model  # noqa: E402
from kiln.frontend.import_blocks import UnsupportedError  # noqa: E402
from kiln.frontend.import_layout import ImportError_  # noqa: E402
from kiln.frontend.torch_import import TorchImportError, from_torch  # noqa: E402

HERE = os.path.basename(__file__)


def _line_of(fn, code):
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, ln in enumerate(lines) if code in ln)


class Branchy(torch.nn.Module):
    def forward(self, x):
        y = torch.relu(x)
        if y.sum() > 0:
            return y * 2
        return y


@pytest.mark.parametrize("strict", [False, True])
def test_graph_break_names_file_line_and_code(strict):
    with pytest.raises(TorchImportError) as e:
        from_torch(Branchy(), (torch.randn(2, 3),), strict=strict)
    msg = str(e.value)
    line = _line_of(Branchy.forward, "if y.sum() > 0:")
    assert "Branchy" in msg and f"{HERE}:{line}: if y.sum() > 0:" in msg, msg
    assert "torch.where or torch.cond" in msg


class TwoUnsupported(torch.nn.Module):
    def forward(self, x):
        a = torch.cumsum(x, 1)
        return torch.cumprod(a, 1)


def test_unsupported_aten_op_names_op_node_line_and_the_others():
    with pytest.raises(UnsupportedError) as e:
        from_torch(TwoUnsupported(), (torch.randn(2, 3),))
    msg = str(e.value)
    line = _line_of(TwoUnsupported.forward, "torch.cumsum")
    assert "aten.cumsum" in msg and "node 'cumsum'" in msg and f"{HERE}:{line}: a = torch.cumsum(x, 1)" in msg
    assert "also unsupported: aten.cumprod" in msg and "docs/import.md" in msg


class ComputedWeight(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.conv2d(x, x * 0.5)


def test_converter_error_names_op_and_line():
    with pytest.raises(ImportError_) as e:
        from_torch(ComputedWeight(), (torch.randn(1, 1, 4, 4),))
    msg = str(e.value)
    line = _line_of(ComputedWeight.forward, "conv2d")
    assert "aten.conv2d" in msg and f"{HERE}:{line}:" in msg and "must be a constant" in msg


def _save(tmp_path, nodes, opset, inits=(), domains=()):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])
    g = helper.make_graph(nodes, "g", [x], [y], list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]
                          + [helper.make_opsetid(d, 1) for d in domains])
    p = str(tmp_path / "m.onnx")
    onnx.save(m, p)
    return p


@pytest.mark.parametrize("opset", [13, 17])
def test_onnx_unsupported_op_names_op_node_and_opset(tmp_path, opset):
    p = _save(tmp_path, [helper.make_node("Relu", ["x"], ["r"], name="act"),
                         helper.make_node("LpNormalization", ["r"], ["y"], name="block3/norm")], opset)
    with pytest.raises(UnsupportedError) as e:
        load_model(p)
    msg = str(e.value)
    assert "LpNormalization" in msg and "'block3/norm'" in msg and f"opset {opset}" in msg


def test_onnx_custom_domain_names_the_domain(tmp_path):
    p = _save(tmp_path, [helper.make_node("FusedThing", ["x"], ["y"], name="f0", domain="com.vendor")], 17,
              domains=["com.vendor"])
    with pytest.raises(UnsupportedError) as e:
        load_model(p)
    assert "FusedThing" in str(e.value) and "com.vendor" in str(e.value) and "'f0'" in str(e.value)


def test_onnx_unsupported_attribute_names_op_node_and_opset(tmp_path):
    c = [helper.make_tensor(n, TensorProto.FLOAT, [2], np.ones(2, np.float32)) for n in ("s", "b", "m", "v")]
    p = _save(tmp_path, [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn1",
                                          training_mode=1)], 15, inits=c)
    with pytest.raises(ImportError_) as e:
        load_model(p)
    msg = str(e.value)
    assert "BatchNormalization" in msg and "'bn1'" in msg and "opset 15" in msg and "training_mode" in msg
