"""ONNX export (float) against onnxruntime: Kiln-native NHWC graphs (conv incl. depthwise/groups,
dense, pools, activations, reshape/transpose/concat/pad/softmax/mean, slice) and models imported
from PyTorch (NCHW at the boundary, no Transpose in a plain CNN's body); the round trip back through
the ONNX importer; errors naming the op and node."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import kiln  # noqa: E402
from kiln import F, nn  # noqa: E402
from kiln.frontend import load_model  # noqa: E402
from kiln.frontend.onnx_export import ONNX_EXPORT, OnnxExportError, export_onnx  # noqa: E402


def ort_run(path, g, xs):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, dict(zip(g.inputs, xs)))


def assert_matches(path, g, xs, atol=1e-5):
    want = kiln.run(g, *xs)
    want = want if isinstance(want, (list, tuple)) else [want]
    got = ort_run(path, g, xs)
    assert len(got) == len(want)
    for a, w in zip(got, want):
        assert a.shape == w.shape and a.dtype == w.dtype
        np.testing.assert_allclose(a, w, atol=atol, rtol=1e-5)


class NHWCNet(nn.Module):
    """Every exported op family on NHWC activations."""

    def __init__(self):
        self.c1 = nn.Conv2d(3, 8, 3, padding="same")
        self.dw = nn.Conv2d(8, 8, 3, stride=2, groups=8, padding="same")
        self.g2 = nn.Conv2d(8, 8, 3, groups=2, padding=1, dilation=1)
        self.dil = nn.Conv2d(8, 4, 3, dilation=2, padding="valid")
        self.fc = nn.Linear(4 + 8, 6)

    def forward(self, x):
        y = F.relu(self.c1(x))
        y = F.relu6(self.dw(y))
        z = F.sigmoid(self.g2(y)) * y - F.tanh(y) / 2.0
        z = F.avg_pool2d(F.pad(z, [0, 0, 1, 1, 1, 1, 0, 0]), 2, stride=1)
        d = F.max_pool2d(F.relu(self.dil(z)), 2)                              # [1, 1, 1, 4]
        flat = F.concat([F.reshape(d, (1, -1)), F.mean(y, [1, 2])], axis=1)
        s = F.transpose(z, [0, 3, 1, 2])[:, :, 1:4, 0:3]
        return F.log_softmax(self.fc(flat)), F.softmax(s, axis=1), F.mean(z, [1], keepdims=True)


def test_nhwc_graph_matches_onnxruntime(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 9, 9, 3)).astype(np.float32)
    g = kiln.trace(NHWCNet(), x)
    ops = {n.op for n in g.nodes}
    assert {"conv2d", "dense", "avg_pool2d", "max_pool2d", "pad", "concat", "softmax", "log_softmax",
            "mean", "transpose", "slice", "relu6", "sigmoid", "tanh"} <= ops
    p = tmp_path / "nhwc.onnx"
    m = export_onnx(g, p)
    assert [i.name for i in m.graph.input] == g.inputs
    dims = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 9, 9, 3]                         # the graph's own layout at the boundary
    for _ in range(3):
        assert_matches(p, g, [rng.standard_normal((1, 9, 9, 3)).astype(np.float32)])


def test_mlp_and_count_include_pad(tmp_path):
    rng = np.random.default_rng(1)

    def f(x, w, b):
        h = F.dense(x, w, b)
        return F.maximum(F.minimum(h, 1.0), -1.0) + F.exp(F.neg(h))

    g = kiln.trace(f, np.zeros((4, 5), np.float32), rng.standard_normal((3, 5)).astype(np.float32),
                   np.zeros(3, np.float32))
    p = tmp_path / "mlp.onnx"
    export_onnx(g, p)
    xs = [rng.standard_normal(s).astype(np.float32) for s in ((4, 5), (3, 5), (3,))]
    assert_matches(p, g, xs)

    def pool(x):
        return F.avg_pool2d(x, 3, stride=2, padding="same", count_include_pad=True)

    g = kiln.trace(pool, np.zeros((1, 6, 6, 2), np.float32))
    export_onnx(g, tmp_path / "pool.onnx")
    assert_matches(tmp_path / "pool.onnx", g, [rng.standard_normal((1, 6, 6, 2)).astype(np.float32)])


@pytest.mark.parametrize("opset", [13, 17])
def test_opsets(tmp_path, opset):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 6, 6, 3)).astype(np.float32)
    g = kiln.trace(lambda x: F.sum(F.max(F.relu(x), [2], keepdims=True), [1, 3]) + F.mean(x), x)
    m = export_onnx(g, tmp_path / "o.onnx", opset=opset)
    assert m.opset_import[0].version == opset
    assert_matches(tmp_path / "o.onnx", g, [x])


@pytest.fixture(scope="module")
def torch_models():
    torch = pytest.importorskip("torch")
    from .import_models import inputs, make
    return torch, make, inputs


@pytest.mark.parametrize("name", ["cnn", "dsnet", "conv1d", "resnet", "lstm", "mobilenet_v2"])
def test_imported_models_match_torch(tmp_path, torch_models, name):
    """A PyTorch model imported to Kiln and exported again runs in onnxruntime like torch does,
    NCHW at the boundary, and a plain CNN has no Transpose in its body."""
    torch, make, inputs = torch_models
    m, shape = make(name)
    g = kiln.from_torch(m, (np.zeros(shape, np.float32),))
    p = tmp_path / f"{name}.onnx"
    model = export_onnx(g, p)
    assert [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim] == list(shape)
    for x in inputs(shape):
        with torch.no_grad():
            want = m(x)
        want = want[0] if isinstance(want, tuple) else want
        np.testing.assert_allclose(ort_run(p, g, [x.numpy()])[0], want.numpy(), atol=1e-4, rtol=0)
    transposes = [n for n in model.graph.node if n.op_type == "Transpose"]
    if name in ("resnet", "dsnet", "mobilenet_v2"):      # global pooling before the classifier
        assert transposes == []
    if name in ("cnn", "conv1d"):                        # only the NHWC flatten before the Linear
        assert len(transposes) == 1


def test_round_trip_through_the_importer(tmp_path, torch_models):
    torch, make, inputs = torch_models
    m, shape = make("resnet")
    g = kiln.from_torch(m, (np.zeros(shape, np.float32),))
    export_onnx(g, tmp_path / "r.onnx")
    back = load_model(str(tmp_path / "r.onnx"))
    assert {k for k in g.params if k.endswith("weight")} <= set(back.params)
    x = inputs(shape)[0].numpy()
    np.testing.assert_allclose(kiln.run(back, x), kiln.run(g, x), atol=1e-5)


def test_int8_graph_refused(tmp_path):
    from kiln.quantize import ptq
    rng = np.random.default_rng(3)
    g = kiln.trace(nn.Sequential(nn.Linear(4, 2), nn.ReLU()), np.zeros((1, 4), np.float32))
    q = ptq(g, rng.standard_normal((8, 4)).astype(np.float32))
    with pytest.raises(OnnxExportError, match="quantised.*float"):
        export_onnx(q, tmp_path / "q.onnx")
    assert not (tmp_path / "q.onnx").exists()


def test_op_without_mapping_names_op_and_node(tmp_path):
    unmapped = sorted(set(kiln.frontend.registry.OPS) - set(ONNX_EXPORT))
    assert unmapped, "every op is mapped: pick another way to test the error"
    g = kiln.trace(lambda x: F.relu(x), np.zeros((2, 3), np.float32))
    g.nodes[0].op = unmapped[0]
    with pytest.raises(OnnxExportError) as e:
        export_onnx(g, tmp_path / "u.onnx")
    assert repr(unmapped[0]) in str(e.value) and g.nodes[0].name in str(e.value)
    assert "exportable ops" in str(e.value)


@pytest.mark.parametrize("name", ["digits-cnn", "ds-cnn", "resnet8", "mobilenet-v1-0.25", "fc-autoencoder"])
def test_model_zoo_exports(tmp_path, name):
    """The zoo's Module API models (NHWC, BatchNorm in eval form, depthwise convs) in onnxruntime."""
    from kiln.training import zoo
    entry = zoo.get(name)
    entry.module.eval()
    x = np.random.default_rng(4).standard_normal(entry.input_shape).astype(np.float32)
    g = kiln.trace(entry.module, x)
    p = tmp_path / f"{name}.onnx"
    m = export_onnx(g, p)
    assert [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim] == list(entry.input_shape)
    assert sum(n.op_type == "Transpose" for n in m.graph.node) <= 1      # the NHWC input, once
    assert_matches(p, g, [x])
