"""Rematerialisation: checkpoint(fn) regions are recomputed in the backward graph, so their
activations die with the forward pass. The executor's peak live bytes for the backward pass of a
6-layer MLP drop, and the gradients are bit-for-bit identical."""
import numpy as np
import pytest

import kiln.frontend as kf
from kiln.autodiff import checkpoint, grad
from kiln.frontend import functional as F
from kiln.frontend.errors import TraceError

BATCH, WIDTH = 256, 32      # activations (32 KiB each) dominate the weight gradients (4 KiB)


class MLP(kf.Module):
    def __init__(self, remat):
        kf.manual_seed(0)
        self.layers = [kf.Linear(WIDTH, WIDTH) for _ in range(6)]
        self.remat = remat

    def block(self, layers):
        def run(h):
            for lin in layers:
                z = lin(h)
                h = z * F.sigmoid(z)   # SiLU: its VJP needs z and sigmoid(z), not only h
            return h
        return run

    def forward(self, x, y):
        if self.remat == "none":
            h = self.block(self.layers)(x)
        elif self.remat == "layer":
            h = x
            for lin in self.layers:
                h = checkpoint(self.block([lin]))(h)
        else:   # three regions of two layers (about sqrt(n) checkpoints)
            h = x
            for k in range(0, 6, 2):
                h = checkpoint(self.block(self.layers[k:k + 2]))(h)
        return F.mean((h - y) ** 2.0)


def _run(remat):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, WIDTH)).astype(np.float32)
    y = rng.standard_normal((BATCH, WIDTH)).astype(np.float32)
    g = kf.trace(MLP(remat), x.shape, y.shape)
    gg = grad(g)
    st = kf.RunStats()
    grads = kf.run(gg, x, y, stats=st)
    return gg, grads, st.peak_live_bytes


def test_checkpoint_lowers_peak_live_bytes_with_identical_gradients():
    g0, base, peak0 = _run("none")
    act = BATCH * WIDTH * 4
    results = {"none": peak0}
    for mode in ("layer", "blocks"):
        g, grads, peak = _run(mode)
        results[mode] = peak
        assert len(g.nodes) > len(g0.nodes)                     # recomputation was emitted
        assert any(n.name.startswith("remat_") for n in g.nodes)
        for a, b in zip(base, grads):
            np.testing.assert_array_equal(a, b)                 # same ops, same order: bitwise
        assert peak < peak0, results
    # without remat each SiLU layer keeps z, sigmoid(z) and h alive for the backward pass (18 of
    # the 21 activation-sized values at the peak); with regions only their boundaries are kept
    assert peak0 >= 18 * act and peak0 - results["layer"] >= 8 * act, results
    print(f"\npeak live bytes, 6-layer MLP backward: {results}")


def test_regions_are_recorded_and_serialisable():
    g = kf.trace(MLP("blocks"), (BATCH, WIDTH), (BATCH, WIDTH))
    regions = g.meta["checkpoint"]
    assert list(regions) == ["0", "1", "2"] and all(len(v) == 6 for v in regions.values())
    assert "checkpoint" not in grad(g).meta


def test_nested_checkpoint_uses_the_outer_region():
    def f(x):
        inner = checkpoint(lambda t: F.tanh(t) * 2.0)
        h = checkpoint(lambda t: F.exp(inner(t)) + 1.0)(x)
        return F.sum(h * h)
    g = kf.trace(f, (4,))
    gg = grad(g, wrt=["x"])
    x = np.linspace(-1, 1, 4).astype(np.float32)
    ref = kf.trace(lambda x: F.sum((F.exp(F.tanh(x) * 2.0) + 1.0) ** 2.0), (4,))
    np.testing.assert_allclose(kf.run(gg, x)[0], kf.run(grad(ref, wrt=["x"]), x)[0], rtol=1e-6)


def test_checkpoint_with_dropout_recomputes_the_same_mask():
    def f(x, k):
        h = checkpoint(lambda t: F.dropout(F.tanh(t), k, 0.5, salt=3) * 3.0)(x)
        return F.sum(h * x)
    g = kf.trace(f, (64,), np.int64(0))
    gg = grad(g, wrt=["x0"])
    plain = kf.trace(lambda x, k: F.sum(F.dropout(F.tanh(x), k, 0.5, salt=3) * 3.0 * x), (64,), np.int64(0))
    x = np.linspace(-2, 2, 64).astype(np.float32)
    np.testing.assert_array_equal(kf.run(gg, x, np.int64(7))[0], kf.run(grad(plain, wrt=["x0"]), x, np.int64(7))[0])


def test_checkpoint_outside_trace_is_an_error():
    with pytest.raises(TraceError, match="while tracing"):
        checkpoint(lambda t: t)(np.ones(2))
