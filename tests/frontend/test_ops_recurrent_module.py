"""nn.LSTM and nn.GRU: forward and gradients against PyTorch, kiln.check_grads, training with
kiln's fit on a sequence task, and export (LSTM as one UNIDIRECTIONAL_SEQUENCE_LSTM) to LiteRT."""
import numpy as np
import pytest

import kiln.frontend as kf
from kiln.autodiff import check_grads, grad
from kiln.frontend import functional as F
from kiln.frontend import run
from kiln.quantize.tflite_export import export_tflite

torch = pytest.importorskip("torch")


class Classifier(kf.Module):
    def __init__(self, cell, i=3, h=6, classes=2):
        self.rnn = cell(i, h)
        self.head = kf.Linear(h, classes)

    def forward(self, x):
        y = self.rnn(x)
        n, t, h = y.shape
        return self.head(F.reshape(F.slice(y, [0, t - 1, 0], [n, t, h]), [n, h]))


@pytest.mark.parametrize("cell,tcell", [(kf.LSTM, "LSTM"), (kf.GRU, "GRU")])
def test_forward_and_grads_match_torch(cell, tcell):
    torch.manual_seed(1)
    tm = getattr(torch.nn, tcell)(3, 4, batch_first=True)
    m = cell(3, 4).load_torch(tm)
    g = kf.trace(lambda x: F.sum(F.mul(m(x), m(x))), (2, 5, 3))
    x = np.random.default_rng(2).standard_normal((2, 5, 3)).astype(np.float32)
    xt = torch.tensor(x, requires_grad=True)
    y = tm(xt)[0]
    loss = (y * y).sum()
    loss.backward()
    np.testing.assert_allclose(run(g, x)[0], loss.item(), rtol=1e-5)
    gg = grad(g, wrt=[g.inputs[0]])
    np.testing.assert_allclose(run(gg, x)[0], xt.grad.numpy(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("cell", [kf.LSTM, kf.GRU])
def test_module_check_grads(cell):
    kf.manual_seed(1)                 # the layer's initial weights: not whatever earlier tests left
    m = Classifier(cell, 2, 3)
    g = kf.trace(lambda x: F.sum(F.tanh(m(x))), (2, 3, 2))
    res = check_grads(g, [np.random.default_rng(3).standard_normal((2, 3, 2))])
    assert res.ok, res


@pytest.mark.parametrize("cell", [kf.LSTM, kf.GRU])
def test_fit_learns_a_sequence_task(cell):
    """Which half of the sequence has the larger sum: needs memory over the steps."""
    from kiln.training.data import ArrayDataset
    from kiln.training.loop import fit
    rng = np.random.default_rng(0)
    x = rng.standard_normal((384, 6, 1)).astype(np.float32)
    y = (x[:, :3].sum((1, 2)) > x[:, 3:].sum((1, 2))).astype(np.int64)
    kf.manual_seed(0)
    res = fit(Classifier(cell, 1, 8), ArrayDataset(x[:320], y[:320], num_classes=2),
              ArrayDataset(x[320:], y[320:], num_classes=2), input_shape=(32, 6, 1), epochs=12, lr=0.02)
    assert res.metrics["test_acc"] >= 0.85, res.metrics


def test_lstm_module_exports_one_fused_op():
    interp = pytest.importorskip("ai_edge_litert.interpreter")
    lstm, head = kf.LSTM(3, 5), kf.Linear(35, 4)
    g = kf.trace(lambda x: F.softmax(head(F.reshape(lstm(x), [1, 35]))), (1, 7, 3))     # the mnist_lstm shape
    assert [n.op for n in g.nodes].count("lstm") == 1
    data = export_tflite(g)
    it = interp.Interpreter(model_content=data, experimental_op_resolver_type=interp.OpResolverType.BUILTIN_REF)
    it.allocate_tensors()
    x = np.random.default_rng(4).standard_normal((1, 7, 3)).astype(np.float32)
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    np.testing.assert_allclose(it.get_tensor(it.get_output_details()[0]["index"]), run(g, x)[0], rtol=1e-5, atol=1e-6)
