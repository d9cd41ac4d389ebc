"""`kiln inspect` says, per op, which targets can run it before anything is compiled, derived from
the op registry (ref, int8_ref, quant, te) and the C backend's kernels: changing the registry
changes the answer."""
import json

import numpy as np
import pytest

import kiln
from kiln import F, nn
from kiln.cli import main
from kiln.commands.op_support import target_support
from kiln.frontend.registry import get_op
from kiln.quantize import ptq


class Net(nn.Module):
    def __init__(self):
        self.c = nn.Conv2d(1, 4, 3)
        self.l = nn.Linear(4, 3)

    def forward(self, x):
        y = F.mean(F.relu(self.c(x)), [1, 2])
        return F.tanh(self.l(y)), F.sin(y)


@pytest.fixture
def graph():
    return kiln.trace(Net(), np.zeros((1, 6, 6, 1), np.float32))


def rows(sup):
    return {(r["op"], r["quantised"]): r for r in sup["ops"]}


def test_float_graph(graph):
    sup = target_support(graph)
    r = rows(sup)
    for op in ("conv2d", "mean", "dense", "tanh", "sin"):
        row = r[(op, False)]
        assert row["reference"] is True and row["c"] is True and row["host-llvm"] is True and row["cuda"] is True
    assert r[("relu", False)]["int8"] == "folded"          # PTQ fuses it into the conv
    assert r[("conv2d", False)]["int8"] is True and r[("tanh", False)]["int8"] is True
    assert get_op("sin").quant is None and r[("sin", False)]["int8"] is False
    sin_node = next(n.name for n in graph.nodes if n.op == "sin")
    assert sup["unsupported"] == {"int8": [sin_node]}
    assert sup["runs_on"] == ["reference", "c", "host-llvm", "cuda"]


def test_answer_follows_the_registry(graph, monkeypatch):
    tanh = get_op("tanh")
    target_support(graph)                                   # the C kernels are registered now
    assert "c" in tanh.lower
    monkeypatch.setattr(tanh, "te", None)
    r = rows(target_support(graph))[("tanh", False)]
    assert r["host-llvm"] is False and r["cuda"] is False and r["c"] is True    # its C kernel remains
    monkeypatch.delitem(tanh.lower, "c")
    r = rows(target_support(graph))[("tanh", False)]
    assert r["c"] is False and r["int8"] is False and r["reference"] is True
    monkeypatch.setattr(tanh, "ref", None)
    assert rows(target_support(graph))[("tanh", False)]["reference"] is False


def test_int8_graph(graph):
    g = kiln.trace(nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(64, 3)),
                   np.zeros((1, 6, 6, 1), np.float32))
    q = ptq(g, np.random.default_rng(0).random((8, 6, 6, 1)).astype(np.float32))
    sup = target_support(q)
    for r in sup["ops"]:
        if r["quantised"]:
            assert r["c"] is True and r["int8"] is True and r["reference"] is True
            assert r["host-llvm"] is False and r["cuda"] is True        # the CUDA int8 lowering
    assert sup["runs_on"] == ["reference", "c", "int8", "cuda"]


def test_int8_cuda_column_follows_the_cuda_lowering(monkeypatch):
    """A quantised node's cuda answer is the CUDA int8 lowering's: without its conv2d rules (the
    CUDA one and the C one it falls back to) the int8 conv is NO on cuda, and only there."""
    from kiln.backends import cuda_int8
    g = kiln.trace(nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(64, 3)),
                   np.zeros((1, 6, 6, 1), np.float32))
    q = ptq(g, np.random.default_rng(0).random((8, 6, 6, 1)).astype(np.float32))
    target_support(q)                                       # the C kernels are registered now
    monkeypatch.delitem(cuda_int8.CUDA_RULES, "conv2d")
    monkeypatch.delitem(get_op("conv2d").lower, "c")
    sup = target_support(q)
    assert rows(sup)[("conv2d", True)]["cuda"] is False and rows(sup)[("dense", True)]["cuda"] is True
    assert sup["unsupported"]["cuda"] == [n.name for n in q.nodes if n.op == "conv2d"]


def test_cli_json_and_text(tmp_path, capsys, graph):
    p = str(tmp_path / "net.json")
    kiln.save(graph, p)
    assert main(["inspect", p, "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["targets"]["targets"] == ["reference", "c", "int8", "host-llvm", "cuda"]
    assert {r["op"] for r in rep["targets"]["ops"]} == {n.op for n in graph.nodes}
    assert main(["inspect", p]) == 0
    text = capsys.readouterr().out
    assert "C (host, boards)" in text and "not on int8 (host, boards): sin_" in text


def test_int16_graph_follows_the_int16_prop(graph, monkeypatch):
    """A 16x8 node runs where its op's int8 reference has TFLite's int16 kernel (the ``int16``
    prop); the same op without it is reported as not running, before anything is compiled."""
    g = kiln.trace(nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(64, 3)),
                   np.zeros((1, 6, 6, 1), np.float32))
    q = ptq(g, np.random.default_rng(0).random((8, 6, 6, 1)).astype(np.float32), activations="int16")
    sup = target_support(q)
    assert sup["runs_on"] == ["reference", "c", "int8", "cuda"]   # the CUDA lowering's 16x8 rules
    dense = get_op("dense")
    monkeypatch.setattr(dense, "props", dense.props - {"int16"})
    sup = target_support(q)
    r = rows(sup)[("dense", True)]
    assert r["reference"] is False and r["c"] is False
    assert [n for n in q.nodes if n.op == "dense"][0].name in sup["unsupported"]["c"]
