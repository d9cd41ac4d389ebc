"""The training loop: accumulation equivalence, determinism, BatchNorm buffers, dropout keys,
NaN detection naming the node, clipping, metrics log."""
import json

import numpy as np
import pytest
import torch

from kiln import frontend as kf
from kiln.frontend import functional as F
from kiln.training import Adam, StepGraph, TrainingDiverged, clip_by_global_norm, fit, global_norm
from kiln.training.monitor import progress_enabled


def _params(m):
    return {k: p.data.copy() for k, p in m.named_parameters() + m.named_buffers()}


def _no_bn_net(seed):
    kf.manual_seed(seed)
    m = kf.Sequential(kf.Conv2d(1, 4, 3, stride=2, padding="same", activation="relu"), kf.Flatten(), kf.Linear(64, 10))
    for p in m.parameters():
        p.data = p.data.astype(np.float64)
    return m


def test_accumulated_micro_batches_equal_one_big_batch(small_digits):
    """Explicit zeroing and accumulation: 4 micro-batches of 8 weighted 1/4 give the Adam update
    of one batch of 32 (float64, within 1e-6; in fact to rounding)."""
    tr, _ = small_digits
    m = _no_bn_net(0)
    x, y = tr.x[:32].astype(np.float64), tr.y[:32]
    params = {k: p.data for k, p in m.named_parameters()}
    _, _, g_big, _ = StepGraph(m, "cross_entropy", (8, 8, 1), 32)(params, {}, x, y)
    small = StepGraph(m, "cross_entropy", (8, 8, 1), 8)
    p1 = {k: v.copy() for k, v in params.items()}
    p2 = {k: v.copy() for k, v in params.items()}
    o1, o2 = Adam(p1, 1e-2), Adam(p2, 1e-2)
    o1.step(g_big)
    o2.zero_grad()
    for i in range(4):
        _, _, g, _ = small(params, {}, x[8 * i:8 * i + 8], y[8 * i:8 * i + 8])
        o2.accumulate(g, 0.25)
    o2.step()
    for k in p1:
        np.testing.assert_allclose(p1[k], p2[k], rtol=0, atol=1e-6)
        assert np.max(np.abs(p1[k] - p2[k])) < 1e-12


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_fit_with_accumulation_equals_big_batches(small_digits, optimizer):
    """A whole epoch (300 samples: 9 steps of 32 then one of 12) with batches of 32, against
    micro-batches of 8 accumulated 4 at a time (the last group holds 8+4 samples): same
    parameters within 1e-6 in float64."""
    tr, _ = small_digits
    big = fit(_no_bn_net(0), tr, epochs=1, batch_size=32, lr=0.05, optimizer=optimizer, seed=3)
    acc = fit(_no_bn_net(0), tr, epochs=1, batch_size=8, accum_steps=4, lr=0.05, optimizer=optimizer, seed=3)
    # the loader permutes with the same generator, so micro-batches tile the big batches
    assert big.steps == acc.steps == 10
    for (k, a), (_, b) in zip(big.module.named_parameters(), acc.module.named_parameters()):
        assert a.data.dtype == np.float64
        np.testing.assert_allclose(a.data, b.data, rtol=0, atol=1e-6, err_msg=k)
        assert np.max(np.abs(a.data - b.data)) < 1e-10


def test_same_seed_is_bit_identical_and_buffers_update(tiny_net, small_digits):
    tr, te = small_digits
    kw = dict(epochs=2, batch_size=16, lr=1e-2, augment="shift:1,noise:0.05", seed=7)
    a = fit(tiny_net(1), tr, te, **kw)
    b = fit(tiny_net(1), tr, te, **kw)
    c = fit(tiny_net(1), tr, te, **dict(kw, seed=8))
    pa, pb, pc = _params(a.module), _params(b.module), _params(c.module)
    assert all(np.array_equal(pa[k], pb[k]) for k in pa)
    assert not all(np.array_equal(pa[k], pc[k]) for k in pa)
    assert not np.allclose(pa["bn.running_mean"], 0.0)     # BatchNorm statistics came back as updates
    assert not np.allclose(pa["bn.running_var"], 1.0)
    assert [h["train_loss"] for h in a.history] == [h["train_loss"] for h in b.history]
    assert a.metrics["test_acc"] == b.metrics["test_acc"] and 0.0 <= a.metrics["test_acc"] <= 1.0


def test_dropout_key_is_a_graph_input(tiny_net, small_digits):
    tr, _ = small_digits
    m = tiny_net(dropout=0.5)
    sg = StepGraph(m, "cross_entropy", (8, 8, 1), 16)
    assert sg.has_dropout and "dropout_key" in sg.graph.inputs
    params = {k: p.data for k, p in m.named_parameters()}
    bufs = {k: b.data for k, b in m.named_buffers()}
    x, y = tr.x[:16], tr.y[:16]
    l1 = sg(params, bufs, x, y, dropout_key=1)[0]
    l1b = sg(params, bufs, x, y, dropout_key=1)[0]
    l2 = sg(params, bufs, x, y, dropout_key=2)[0]
    assert l1 == l1b and l1 != l2
    assert set(sg(params, bufs, x, y, 1)[3]) == {"bn.running_mean", "bn.running_var"}


class SqrtNet(kf.Module):
    def __init__(self):
        self.fc = kf.Linear(64, 10)

    def forward(self, x):
        return F.sqrt(self.fc(F.reshape(x, (x.shape[0], -1))))    # NaN for negative pre-activations


def test_nan_stops_the_run_and_names_the_node(small_digits, tmp_path):
    tr, _ = small_digits
    kf.manual_seed(0)
    with pytest.raises(TrainingDiverged) as e:
        fit(SqrtNet(), tr, epochs=1, batch_size=16, out=str(tmp_path))
    assert e.value.op == "sqrt" and e.value.node.startswith("sqrt")
    msg = str(e.value)
    assert "epoch 1, step 1" in msg and "sqrt" in msg and "NaN" in msg
    event = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert event["event"] == "diverged" and event["op"] == "sqrt" and event["node"] == e.value.node


def test_huge_learning_rate_diverges_with_a_named_node(tiny_net, small_digits):
    tr, _ = small_digits
    with pytest.raises(TrainingDiverged) as e:
        fit(tiny_net(dropout=0.0), tr, epochs=3, batch_size=16, lr=1e30, optimizer="sgd", momentum=0.0)
    assert e.value.node is not None and e.value.op


def test_clipping_matches_torch():
    rng = np.random.default_rng(0)
    grads = {"a": rng.standard_normal((3, 4)), "b": rng.standard_normal(5) * 10}
    n = global_norm(grads)
    ts = [torch.tensor(g) for g in grads.values()]
    for t in ts:
        t.grad = t.clone()
    tn = torch.nn.utils.clip_grad_norm_(ts, 2.0)
    assert n == pytest.approx(float(tn), rel=1e-12)
    clipped = clip_by_global_norm(grads, 2.0, n)
    for g, t in zip(clipped.values(), ts):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-12)
    assert clip_by_global_norm(grads, 1e9, n) is grads


def test_grad_clip_bounds_the_update(tiny_net, small_digits):
    tr, _ = small_digits
    r = fit(tiny_net(dropout=0.0), tr, epochs=1, batch_size=32, lr=1.0, optimizer="sgd", momentum=0.0,
            grad_clip=1e-3, max_steps=3)
    assert r.steps == 3 and r.history == []
    assert r.metrics["steps"] == 3


def test_metrics_log_and_outputs(tiny_net, small_digits, tmp_path):
    tr, te = small_digits
    r = fit(tiny_net(), tr, te, epochs=2, batch_size=32, out=str(tmp_path), model_name="tiny")
    lines = [json.loads(s) for s in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [d["epoch"] for d in lines] == [1, 2]
    for d in lines:
        assert {"train_loss", "train_acc", "test_loss", "test_acc", "grad_norm", "lr", "step", "seconds"} <= set(d)
    g = kf.load(str(tmp_path / "model.json"))
    assert g.inputs == ["x"] and g.types["x"].shape == (1, 8, 8, 1)
    assert not g.updates          # an eval-mode graph
    out = kf.run(g, te.x[:1])[0]
    assert out.shape == (1, 10)
    assert set(r.files) == {"checkpoint", "metrics", "graph"}


def test_progress_bars_off_when_quiet_or_not_a_tty():
    assert not progress_enabled(True)
    assert not progress_enabled(False)        # pytest captures stderr: not a TTY
