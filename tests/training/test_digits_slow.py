"""The digits demo recipe reaches its accuracy target (fixed seed)."""
import pytest


@pytest.mark.slow
def test_digits_cnn_reaches_97_percent(tmp_path):
    from kiln.training import train_digits
    r = train_digits(seed=0, out=str(tmp_path))
    assert r.metrics["test_acc"] >= 0.97, r.history[-1]
    assert r.graph.types[r.graph.inputs[0]].shape == (1, 8, 8, 1)
    assert sum(v.size for v in r.graph.params.values()) == 3818
