"""Boards in parallel: `kiln bench -j N` gives the same figures as -j 1, and each QEMU talks only to
its own Device even when another process takes the port it was given."""
import json
import os
import socket

import numpy as np
import pytest

from kiln.boards import qemu as Q
from kiln.cli import main
from kiln.frontend import Graph, QParams, TensorType, save
from tests.firmware import helpers


def _dense_model(path):
    rng = np.random.default_rng(5)
    g = Graph("dense_bench")
    g.add_input("x", TensorType((1, 64), "int8", QParams((0.05,), (3,))))
    g.add_const("w", rng.integers(-127, 128, (16, 64)).astype(np.int8), QParams((0.01,), (0,)))
    g.add_const("b", rng.integers(-500, 500, 16).astype(np.int32))
    g.add_node("dense", ["x", "w", "b"], {"activation": "relu"}, name="y",
               out_type=TensorType((1, 16), "int8", QParams((0.1,), (-128,))))
    g.outputs = ["y"]
    save(g, str(path))
    return str(path)


def test_bench_jobs_gives_the_same_figures(tmp_path, capsys):
    helpers.need_qemu()
    model = _dense_model(tmp_path / "dense.json")
    rows = {}
    for jobs in (1, 2):
        rc = main(["bench", "--models", model, "--boards", "mps2-an385,mps2-an386,mps3-an547",
                   "--optimize", "size", "-j", str(jobs), "-o", str(tmp_path / f"j{jobs}"), "--json"])
        out = capsys.readouterr().out
        assert rc == 0, out
        rows[jobs] = [{k: v for k, v in r.items() if k != "seconds"} for r in json.loads(out)["rows"]]
    assert [r["board"] for r in rows[2]] == ["mps2-an385", "mps2-an386", "mps3-an547"]   # in order
    assert all(r["bit_exact"] and r["instructions"] for r in rows[2])
    assert rows[1] == rows[2]


def test_bench_jobs_must_be_positive(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "-j", "0"])
    assert e.value.code == 2 and "at least 1" in capsys.readouterr().err


def test_owns_listener_tells_whose_socket_listens():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        assert Q._owns_listener(os.getpid(), port)
        assert not Q._owns_listener(1, port)            # listening, but not init's
    assert not Q._owns_listener(os.getpid(), port)      # closed


def test_qemu_never_connects_to_someone_elses_port(monkeypatch, an386_image):
    """Another process holds the port QEMU was given (kiln bench -j, pytest -n): QEMU cannot bind
    it and must try another, and its Device must talk to this QEMU. Was: the other process's
    listening socket was taken for QEMU's, and the Device connected to it."""
    helpers.need_qemu()
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen(1)
        taken = other.getsockname()[1]
        ports = iter([taken])
        real = Q.free_port
        monkeypatch.setattr(Q, "free_port", lambda: next(ports, None) or real())
        with Q.Qemu(an386_image) as q:
            assert q.port != taken
            dev = q.device(timeout=5.0)
            try:
                x, want = helpers.sample()
                out, res = dev.run(x.tobytes())
                assert np.array_equal(helpers.as_int8(out), want.reshape(-1)) and res.instructions
            finally:
                dev.close()
