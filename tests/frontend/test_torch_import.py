"""torch.export import against torch itself: every model within 1e-4 of PyTorch's outputs, NCHW
kept at the boundary and NHWC inside (one transpose, at the image input), names kept, errors that
name the op and the Python line."""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import kiln  # noqa: E402
from kiln.frontend import load_model  # noqa: E402
from kiln.frontend.import_blocks import UnsupportedError  # noqa: E402
from kiln.frontend.torch_import import TorchImportError, from_torch  # noqa: E402

from .import_models import MODELS, inputs, make  # noqa: E402


def _outs(y):
    return [t.detach().numpy() for t in (y if isinstance(y, (tuple, list)) else (y,))]


def check_against_torch(m, g, shape, atol=1e-4):
    for x in inputs(shape):
        want = _outs(m(x))
        got = kiln.run(g, x.numpy())
        got = got if isinstance(got, (list, tuple)) else [got]
        assert len(got) == len(want)
        for a, w in zip(got, want):
            assert a.shape == w.shape
            np.testing.assert_allclose(a, w, atol=atol, rtol=0)


@pytest.mark.parametrize("name", [n for n in MODELS if n not in ("mobilenet_v2", "resnet18")])
def test_matches_torch(name):
    m, shape = make(name)
    g = from_torch(m, (torch.randn(*shape),))
    check_against_torch(m, g, shape)
    assert g.types[g.inputs[0]].shape == shape          # the input keeps PyTorch's layout


@pytest.mark.parametrize("name", ["mobilenet_v2", "resnet18"])
def test_torchvision_architectures(name):
    m, shape = make(name)
    g = from_torch(m, (torch.randn(*shape),))
    check_against_torch(m, g, shape)
    ops = [n.op for n in g.nodes]
    assert ops.count("transpose") == 1 and g.nodes[0].op == "transpose" and g.nodes[0].inputs == g.inputs


@pytest.mark.parametrize("name", ["cnn", "dsnet", "conv1d", "resnet"])
def test_no_transpose_in_the_body(name):
    m, shape = make(name)
    g = from_torch(m, (torch.randn(*shape),))
    tr = [n for n in g.nodes if n.op == "transpose"]
    assert len(tr) == 1 and tr[0].inputs == g.inputs       # NCHW -> NHWC once, at the input
    conv = next(n for n in g.nodes if n.op == "conv2d")
    assert conv.inputs[1].endswith("weight") and g.params[conv.inputs[1]].ndim == 4


def test_layouts_and_names():
    m, shape = make("cnn")
    g = from_torch(m, (torch.randn(*shape),))
    assert set(g.params) == {k for k, _ in m.named_parameters()}
    assert {"bn.running_mean", "bn.running_var"} <= set(g.consts)
    w = m.c1.weight.detach().numpy()
    np.testing.assert_array_equal(g.params["c1.weight"], w.transpose(0, 2, 3, 1))      # OIHW -> OHWI
    # the Linear after the flatten reads NHWC: its columns are permuted (C,H,W order -> H,W,C)
    fc = m.fc.weight.detach().numpy().reshape(10, 16, 2, 2)
    np.testing.assert_array_equal(g.params["fc.weight"], fc.transpose(0, 2, 3, 1).reshape(10, -1))


def test_nchw_output_kept():
    m, shape = make("blocks")
    g = from_torch(m, (torch.randn(*shape),))
    outs = _outs(m(torch.randn(*shape)))
    assert [g.types[o].shape for o in g.outputs] == [o.shape for o in outs]


def test_pt2_file_and_every_loader(tmp_path):
    m, shape = make("lstm")
    p = str(tmp_path / "lstm.pt2")
    torch.export.save(torch.export.export(m, (torch.randn(*shape),)), p)
    g = load_model(p)
    check_against_torch(m, g, shape)
    assert "lstm.weight_ih_l0" in g.params


def test_module_mode_restored():
    m, shape = make("cnn")
    m.train()
    from_torch(m, (torch.randn(*shape),))
    assert m.training


class _Cumsum(torch.nn.Module):
    def forward(self, x):
        return torch.cumsum(x, 1)          # the line the error names


def test_unsupported_op_names_op_and_line():
    with pytest.raises(UnsupportedError) as e:
        from_torch(_Cumsum(), (torch.randn(2, 3),))
    msg = str(e.value)
    assert "aten.cumsum" in msg and os.path.basename(__file__) in msg and "torch.cumsum(x, 1)" in msg


class _Branchy(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:                    # data-dependent control flow: a graph break
            return x * 2
        return x


def test_graph_break_names_the_line():
    with pytest.raises(TorchImportError) as e:
        from_torch(_Branchy(), (torch.randn(2, 3),))
    assert "_Branchy" in str(e.value) and "torch.export could not capture" in str(e.value)


def test_unreadable_pt2(tmp_path):
    p = tmp_path / "bad.pt2"
    p.write_bytes(b"not a zip")
    with pytest.raises(TorchImportError, match="not a readable torch.export program"):
        load_model(str(p))
