"""Training takes a step compiler (kiln.step_compiler resolves a backend name through the one
registry of backends); a string it cannot run itself is an error saying what to pass; the run
records the compiler's name; `kiln train --backend tvm` still works, with a note."""
import json
import warnings

import numpy as np
import pytest

import kiln
from kiln.cli import main
from kiln.frontend import functional as Fn
from kiln.frontend.errors import UsageError
from kiln.frontend.module import Linear, Module, manual_seed
from kiln.training import ArrayDataset, StepGraph, fit
from kiln.training.step import StepCompiler


class _MLP(Module):
    def __init__(self):
        self.l1 = Linear(6, 8)
        self.l2 = Linear(8, 2)

    def forward(self, x):
        return self.l2(Fn.relu(self.l1(x)))


def _data():
    rng = np.random.default_rng(0)
    x = rng.random((32, 6)).astype(np.float32)
    y = (x[:, 0] > 0.5).astype(np.int64)
    return ArrayDataset(x[:24], y[:24], "train"), ArrayDataset(x[24:], y[24:], "test")


@pytest.mark.parametrize("name", ["tvm", "host-llvm", "cuda", "vulkan"])
def test_a_string_training_cannot_run_says_what_to_pass(name):
    manual_seed(0)
    with pytest.raises(UsageError, match=rf"unknown training backend '{name}'.*kiln.step_compiler\('host-llvm'\)"):
        StepGraph(_MLP(), "cross_entropy", (6,), 4, backend=name)


def test_step_compiler_names():
    assert kiln.step_compiler("numpy") == "numpy"
    c = kiln.step_compiler("host-llvm")
    assert isinstance(c, StepCompiler) and c.name == "host-llvm"
    with pytest.warns(DeprecationWarning, match="'tvm' is now called 'host-llvm'"):
        assert kiln.step_compiler("tvm").name == "host-llvm"
    with pytest.raises(UsageError, match=r"unknown training backend 'gpu': use 'numpy', 'host-llvm', 'cuda'"):
        kiln.step_compiler("gpu")


def test_fit_with_a_step_compiler_matches_numpy_and_records_its_name():
    train, test = _data()
    runs = {}
    for backend in ("numpy", kiln.step_compiler("host-llvm")):
        manual_seed(0)
        runs[getattr(backend, "name", backend)] = fit(_MLP(), train, test, epochs=1, batch_size=8, lr=0.1,
                                                       backend=backend)
    assert runs["host-llvm"].config.backend == "host-llvm" and runs["numpy"].config.backend == "numpy"
    a, b = runs["numpy"].history[-1], runs["host-llvm"].history[-1]
    assert abs(a["train_loss"] - b["train_loss"]) <= 1e-5 and abs(a["test_loss"] - b["test_loss"]) <= 1e-5


def test_cli_old_backend_name_still_trains(capsys, tmp_path):
    (tmp_path / "mlp.py").write_text(
        "from kiln import nn\nINPUT_SHAPE = (1, 6)\n"
        "def model():\n    return nn.Sequential(nn.Linear(6, 8, activation='relu'), nn.Linear(8, 2))\n")
    train, test = _data()
    np.savez(tmp_path / "d.npz", x_train=train.x, y_train=train.y, x_test=test.x, y_test=test.y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")     # the CLI says it on stderr, not as a warning
        rc = main(["train", "--model", str(tmp_path / "mlp.py"), "--data", str(tmp_path / "d.npz"), "--epochs", "1",
                   "--batch-size", "8", "--backend", "tvm", "--json", "--quiet", "--out", str(tmp_path / "out")])
    cap = capsys.readouterr()
    rep = json.loads(cap.out.strip().splitlines()[-1])
    assert rc == 0 and rep["config"]["backend"] == "host-llvm"
    assert "--backend tvm is deprecated, use --backend host-llvm" in cap.err
