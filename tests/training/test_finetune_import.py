"""Fine-tuning imported models: GraphModule replays an imported graph (eval mode: the graph itself;
train mode: BatchNorm on batch statistics, as PyTorch's train mode), and `kiln train --model
model.json|.pt2 --resume` lowers the loss."""
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import kiln  # noqa: E402
from kiln.cli import main  # noqa: E402
from kiln.frontend.graph_module import GraphModule  # noqa: E402
from kiln.frontend.torch_import import from_torch  # noqa: E402
from tests.frontend.import_models import make  # noqa: E402


@pytest.mark.parametrize("name", ["cnn", "conv1d", "lstm"])
def test_eval_replay_is_the_graph(name):
    m, shape = make(name)
    g = from_torch(m, (torch.randn(*shape),))
    gm = GraphModule(g).eval()
    x = np.random.default_rng(0).standard_normal((5,) + shape[1:]).astype(np.float32)   # another batch size
    h = kiln.trace(gm, x)
    np.testing.assert_allclose(kiln.run(h, x)[0], m(torch.from_numpy(x)).detach().numpy(), atol=1e-4)
    assert set(dict(gm.named_parameters())) == set(g.params)


@pytest.mark.parametrize("name", ["cnn", "conv1d", "resnet"])
def test_train_mode_batchnorm_is_torchs(name):
    m, shape = make(name)
    g = from_torch(m, (torch.randn(*shape),))
    gm = GraphModule(g).train()
    x = np.random.default_rng(1).standard_normal((6,) + shape[1:]).astype(np.float32)
    h = kiln.trace(gm, x)
    m.train()
    want = m(torch.from_numpy(x)).detach().numpy()            # also updates torch's running stats
    outs, updates = kiln.frontend.run_updates(h, x)
    np.testing.assert_allclose(outs[0], want, atol=1e-4)
    tm = dict(m.named_buffers())
    for buf, val in updates.items():
        np.testing.assert_allclose(val, tm[buf].numpy(), atol=1e-5, err_msg=buf)
    assert updates


def _data(shape, path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((192,) + shape[1:]).astype(np.float32)
    y = (x[:, 0].mean(axis=tuple(range(1, x.ndim - 1))) > 0).astype(np.int64)
    np.savez(path, x_train=x[:128], y_train=y[:128], x_test=x[128:], y_test=y[128:])
    return path


@pytest.mark.parametrize("fmt", ["json", "pt2"])
def test_kiln_train_resume_lowers_the_loss(tmp_path, capsys, fmt):
    m, shape = make("cnn")
    p = str(tmp_path / "cnn.pt2")
    torch.export.save(torch.export.export(m, (torch.randn(*shape),)), p)
    if fmt == "json":
        assert main(["import", p, "-o", str(tmp_path / "cnn.json")]) == 0
        p = str(tmp_path / "cnn.json")
    data = _data(shape, str(tmp_path / "d.npz"))
    out = str(tmp_path / "run")
    base = ["train", "--model", p, "--data", data, "--out", out, "--quiet", "--lr", "0.01", "--json"]
    assert main(base + ["--epochs", "1"]) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(base + ["--epochs", "4", "--resume"]) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["epochs"] == 4 and last["train_loss"] < first["train_loss"]
    g = kiln.load(os.path.join(out, "model.json"))
    assert g.types[g.inputs[0]].shape == (1,) + shape[1:]          # still NCHW
    assert g.meta.get("batchnorm")                                   # fine-tunes the same way again


def test_kiln_train_model_file_needs_data(tmp_path, capsys):
    m, shape = make("cnn")
    g = from_torch(m, (torch.randn(*shape),))
    kiln.save(g, str(tmp_path / "m.json"))
    assert main(["train", "--model", str(tmp_path / "m.json"), "--out", str(tmp_path / "r")]) == 2
    assert "--data" in capsys.readouterr().err
