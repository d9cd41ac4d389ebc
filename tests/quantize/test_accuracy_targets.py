"""Issue targets on the fully trained digits CNN (slow: trains the demo recipe): int8 within
1.0 pp of float with PTQ and within 0.3 pp with QAT."""
import pytest

from kiln.commands.quantize import accuracy


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_digits_int8_accuracy_targets(seed):
    from kiln.quantize import ptq, qat
    from kiln.training import digits, train_digits
    train, test = digits()
    g = train_digits(seed=seed).graph
    fa = accuracy(g, test.x, test.y)
    pa = accuracy(ptq(g, train.x[:500]), test.x, test.y)
    qa = accuracy(qat(g, train, test, epochs=3, lr=1e-4, calibration=train.x[:500]).graph, test.x, test.y)
    assert pa >= fa - 0.010 + 1e-9, f"PTQ {pa:.4f} vs float {fa:.4f}"
    assert qa >= fa - 0.003 + 1e-9, f"QAT {qa:.4f} vs float {fa:.4f}"
