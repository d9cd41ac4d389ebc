"""Model zoo: shapes, parameter counts against the MLPerf Tiny reference models, one training step."""
import numpy as np
import pytest

from kiln import frontend as kf
from kiln.training import StepGraph, zoo

# trainable parameters; with BatchNorm running statistics the first two are the Keras totals of
# the MLPerf Tiny reference models (DS-CNN 24,908; ResNet-8 78,666)
COUNTS = {"ds-cnn": (23756, 24908), "resnet8": (78186, 78666), "mobilenet-v1-0.25": (216322, None),
          "fc-autoencoder": (267928, None), "digits-cnn": (3818, 3818)}
OUT = {"ds-cnn": 12, "resnet8": 10, "mobilenet-v1-0.25": 2, "fc-autoencoder": 640, "digits-cnn": 10}


@pytest.mark.parametrize("name", zoo.names())
def test_zoo_model_shapes_counts_and_one_step(name):
    kf.manual_seed(0)
    z = zoo.get(name)
    module, shape, dataset, loss = z[:4]
    n = sum(p.data.size for p in module.parameters())
    total = n + sum(b.data.size for _, b in module.named_buffers())
    assert n == COUNTS[name][0] and COUNTS[name][1] in (None, total)
    g = kf.trace(module.eval(), shape)
    assert kf.run(g, np.zeros(shape, np.float32))[0].shape == (1, OUT[name])
    module.train()
    batch = 2
    sg = StepGraph(module, loss, shape[1:], batch)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch,) + shape[1:]).astype(np.float32)
    y = rng.integers(0, OUT[name], batch) if sg.target_input == "labels" else None
    params = {k: p.data for k, p in module.named_parameters()}
    bufs = {k: b.data for k, b in module.named_buffers()}
    loss_v, pred, grads, upd = sg(params, bufs, x, y, dropout_key=1)
    assert np.isfinite(loss_v) and set(grads) == set(params) and set(upd) == set(bufs)
    assert all(np.all(np.isfinite(g)) for g in grads.values())
    assert sg.has_dropout == (name == "ds-cnn")
    assert dataset in ("digits", "synthetic")


def test_unknown_model_and_user_model_files(tmp_path):
    with pytest.raises(kf.KilnError, match="unknown zoo model 'lenet'"):
        zoo.get("lenet")
    p = tmp_path / "m.py"
    p.write_text("from kiln import nn\nINPUT_SHAPE = (1, 8, 8, 1)\nDATASET = 'd.npz'\n"
                 "def model():\n    return nn.Sequential(nn.Flatten(), nn.Linear(64, 10))\n")
    z = zoo.load_user_model(str(p))
    assert z.input_shape == (1, 8, 8, 1) and z.dataset == str(tmp_path / "d.npz") and z.loss == "cross_entropy"
    p.write_text("x = 1\n")
    with pytest.raises(kf.KilnError, match="must define model"):
        zoo.load_user_model(str(p))
    p.write_text("def model():\n    return 3\n")
    with pytest.raises(kf.KilnError, match="returned int"):
        zoo.load_user_model(str(p))
    p.write_text("import nonexistent_pkg_xyz\n")
    with pytest.raises(kf.KilnError, match="importing the model file failed"):
        zoo.load_user_model(str(p))
