"""Graph files: exact round trips (traced graphs and grad graphs), and clear SerializationErrors for
corrupt, truncated, mismatched or newer files."""
import json
import os

import numpy as np
import pytest

import kiln.frontend as kf
from kiln.autodiff import checkpoint, grad
from kiln.frontend import functional as F
from kiln.frontend.errors import LimitError, SerializationError
from kiln.frontend.serialize import FORMAT_VERSION, to_dict


def _model():
    kf.manual_seed(0)
    return kf.Sequential(kf.Conv2d(2, 4, 3, stride=2, padding="same", activation="relu6"),
                         kf.BatchNorm2d(4), kf.Dropout(0.25), kf.MaxPool2d(2, 1, [0, 1, 0, 1]),
                         kf.AvgPool2d(2, padding="same"), kf.Flatten(), kf.Linear(16, 3))


def _assert_same(a, b):
    assert to_dict(a) == to_dict(b)
    assert a.pretty() == b.pretty()
    for d1, d2 in ((a.params, b.params), (a.consts, b.consts)):
        assert list(d1) == list(d2)
        for k in d1:
            assert d1[k].dtype == d2[k].dtype
            np.testing.assert_array_equal(d1[k], d2[k])


def _loss_graph():
    def f(x, y):
        h = checkpoint(lambda t: F.tanh(t @ np.full((3, 3), 0.3, np.float32)) * 1.0000001)(x)
        return F.mean((F.log_softmax(h, -1) - y) ** 2.0) + F.sum(h[:, 1:2]) * 1e-3
    return kf.trace(f, (4, 3), (4, 3))


def test_traced_model_round_trip_is_exact(tmp_path):
    g = kf.trace(_model(), (2, 8, 8, 2))
    path = kf.save(g, tmp_path / "model")
    assert path.endswith("model.json") and os.path.exists(tmp_path / "model.npz")
    g2 = kf.load(path)
    _assert_same(g, g2)
    x = np.random.default_rng(0).standard_normal((2, 8, 8, 2)).astype(np.float32)
    np.testing.assert_array_equal(kf.run(g, x, np.int64(5))[0], kf.run(g2, x, np.int64(5))[0])
    assert g2.updates == g.updates and g2.meta == g.meta


def test_grad_graph_round_trip_is_exact(tmp_path):
    g = _loss_graph()
    gg = grad(g, wrt=["x0"], keep_outputs=True)
    g2 = kf.load(kf.save(gg, tmp_path / "grad.json"))
    _assert_same(gg, g2)
    x, y = np.random.default_rng(1).standard_normal((2, 4, 3)).astype(np.float32)
    for a, b in zip(kf.run(gg, x, y), kf.run(g2, x, y)):
        np.testing.assert_array_equal(a, b)
    # and the loaded grad graph is differentiable again
    assert grad(g2, of=g2.outputs[0], wrt=["x0"]).outputs


def test_special_float_attributes_and_float64_constants_round_trip(tmp_path):
    g = kf.trace(lambda x: F.pad(x, [1, 1], value=-np.inf) * 0.1 + x[0:1] ** -0.3333333333333333,
                 kf.TensorType((3,), "float64"))
    g2 = kf.load(kf.save(g, tmp_path / "g"))
    _assert_same(g, g2)
    assert [n.attrs for n in g2.nodes] == [n.attrs for n in g.nodes]


def _saved(tmp_path):
    return kf.save(kf.trace(lambda x: F.relu(x) * 2.0, (3,)), tmp_path / "g")


def _edit(path, fn):
    d = json.loads(open(path).read())
    fn(d)
    open(path, "w").write(json.dumps(d))


@pytest.mark.parametrize("corrupt,message", [
    (lambda p, n: open(p, "w").write("{ not json"), "corrupt JSON"),
    (lambda p, n: open(p, "wb").write(b"\xff\xfe\x00"), "corrupt JSON"),
    (lambda p, n: open(p, "w").write("[" * 100000), "not a Kiln graph file"),
    (lambda p, n: open(p, "w").write("[1, 2]"), "not a Kiln graph file"),
    (lambda p, n: _edit(p, lambda d: d.update(format="onnx")), "not a Kiln graph file"),
    (lambda p, n: _edit(p, lambda d: d.update(version=FORMAT_VERSION + 1)), "newer than this Kiln reads"),
    (lambda p, n: _edit(p, lambda d: d.update(version="1")), "invalid format version"),
    (lambda p, n: _edit(p, lambda d: d.update(params=None)), "malformed graph header"),
    (lambda p, n: _edit(p, lambda d: d["nodes"][0].update(op="no_such_op")), "unknown op 'no_such_op'"),
    (lambda p, n: _edit(p, lambda d: d["nodes"].reverse()), "used before it is defined"),
    (lambda p, n: _edit(p, lambda d: d["types"].update(x={"shape": [-1], "dtype": "float32"})), "malformed graph"),
    (lambda p, n: _edit(p, lambda d: d.pop("types")), "malformed graph"),
    (lambda p, n: _edit(p, lambda d: d["types"].update(x=[])), "malformed graph"),
    (lambda p, n: open(n, "r+b").write(b"garbage"), "checksum mismatch"),
    (lambda p, n: os.remove(n), "is missing"),
    (lambda p, n: os.remove(p), "no such graph file"),
])
def test_corrupt_files_fail_clearly(tmp_path, corrupt, message):
    path = _saved(tmp_path)
    corrupt(path, path[:-5] + ".npz")
    with pytest.raises(SerializationError, match=message):
        kf.load(path)


def test_tensor_file_corrupt_without_checksum(tmp_path):
    path = _saved(tmp_path)
    _edit(path, lambda d: d["tensors"].pop("sha256"))
    open(path[:-5] + ".npz", "wb").write(b"PK\x03\x04 truncated")
    with pytest.raises(SerializationError, match="corrupt tensor file"):
        kf.load(path)


def test_tensor_file_path_in_header_is_not_followed(tmp_path):
    path = _saved(tmp_path)
    _edit(path, lambda d: d["tensors"].update(file="/etc/passwd"))
    with pytest.raises(SerializationError, match="passwd is missing"):
        kf.load(path)


def test_huge_type_in_file_is_a_limit_error(tmp_path):
    path = _saved(tmp_path)
    _edit(path, lambda d: d["types"].update(x={"shape": [10 ** 9, 10 ** 9], "dtype": "float32"}))
    with pytest.raises(LimitError, match="max_tensor_elements"):
        kf.load(path)
