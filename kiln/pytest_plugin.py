"""Kiln's pytest plugin (entry point ``pytest11: kiln``: installing kiln-ml is enough).

One test runs on every board given:

    def test_kws(kiln_board):
        fig = kiln_board.run("kws_ref_model.tflite", inputs=4)     # or golden="kws.golden.npz"
        assert fig["bit_exact"]

    pytest --kiln-board mps2-an386,mps3-an547           # emulated boards (QEMU)
    pytest --kiln-board nucleo-l4r5zi --kiln-lab-map lab.toml   # real boards on local ports
    pytest --labgrid-tag board=nucleo-l4r5zi --labgrid-tag board=rpi-pico   # places on a labgrid farm
    pytest --kiln-place lab-an386                        # a labgrid place by name

Markers skip boards a test cannot run on:

    @pytest.mark.kiln_cores("cortex-m4", "cortex-m7")     # only these cores
    @pytest.mark.kiln_memory(ram=256 * 1024, flash=1024 * 1024)   # at least this much

Every :meth:`KilnBoard.run` records its figures (instructions or cycles, arena, flash, bit-exact)
as JUnit XML properties (``pytest --junitxml``) and in one JSON file (``--kiln-results FILE``),
also under pytest-xdist.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np
import pytest

FIGURES = ("board", "instructions", "instruction_source", "estimated_cycles", "cycles", "arena_bytes",
           "flash_bytes", "bit_exact")
PREFIX = "kiln_"        # user property names of the figures


@dataclass(frozen=True)
class BoardParam:
    """One parametrisation of kiln_board: a board name (QEMU, a port / lab map), or a labgrid
    place (by name or by tags)."""
    name: str | None = None
    place: str | None = None
    tags: tuple = ()

    @property
    def id(self) -> str:
        if self.place:
            return f"place={self.place}"
        if self.tags:
            return ",".join(f"{k}={v}" for k, v in self.tags)
        return self.name


def pytest_addoption(parser):
    g = parser.getgroup("kiln", "Kiln boards (kiln_board fixture)")
    g.addoption("--kiln-board", default=os.environ.get("KILN_BOARDS"), metavar="B[,B...]",
                help="boards the kiln_board fixture runs on (default: $KILN_BOARDS, else mps2-an386)")
    g.addoption("--kiln-lab-map", default=None, metavar="FILE",
                help="lab map TOML naming which real board is on which port (default: $KILN_LAB_MAP)")
    g.addoption("--kiln-port", default=None, metavar="URL", help="serial port / pyserial URL of the one real board")
    g.addoption("--labgrid-tag", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE]",
                help="a labgrid place with these tags (repeatable: one kiln_board per option)")
    g.addoption("--kiln-place", action="append", default=[], metavar="PLACE",
                help="a labgrid place by name (repeatable)")
    g.addoption("--kiln-wait", type=float, default=600.0, metavar="SECONDS",
                help="how long to wait for a busy labgrid place (default: 600)")
    g.addoption("--kiln-results", default=None, metavar="FILE",
                help="write every kiln_board figure of the session to this JSON file")


def pytest_configure(config):
    config.addinivalue_line("markers", "kiln_cores(*cores): run only on boards with one of these cores")
    config.addinivalue_line("markers", "kiln_memory(ram=0, flash=0): run only on boards with at least "
                                       "this much RAM / flash (bytes)")


def board_params(config) -> list[BoardParam]:
    """The kiln_board parametrisations the options ask for."""
    from kiln.boards.farm import parse_tags
    params = [BoardParam(place=p) for p in config.getoption("kiln_place")]
    for text in config.getoption("labgrid_tag"):
        params.append(BoardParam(tags=tuple(sorted(parse_tags(text.split(",")).items()))))
    names = config.getoption("kiln_board")
    if names or not params:
        params += [BoardParam(name=n) for n in (names or "mps2-an386").split(",") if n]
    return params


def pytest_generate_tests(metafunc):
    if "kiln_board" in metafunc.fixturenames:
        params = board_params(metafunc.config)
        metafunc.parametrize("kiln_board", params, ids=[p.id for p in params], indirect=True)


def _skip_reason(item, board) -> str | None:
    for m in item.iter_markers("kiln_cores"):
        if board.core not in m.args:
            return f"{board.name} has a {board.core} (test runs on {', '.join(m.args)})"
    for m in item.iter_markers("kiln_memory"):
        ram, flash = m.kwargs.get("ram", 0), m.kwargs.get("flash", 0)
        if board.ram_region.size < ram:
            return f"{board.name} has {board.ram_region.size:,} B of RAM, the test needs {ram:,}"
        if board.flash_region.size < flash:
            return f"{board.name} has {board.flash_region.size:,} B of flash, the test needs {flash:,}"
    return None


class KilnBoard:
    """The board a test runs on: ``board`` (its data), ``run()``, ``record()``."""

    def __init__(self, request, param: BoardParam, lease=None):
        from kiln import boards
        self.request = request
        self.param = param
        self.lease = lease
        self.name = lease.board if lease is not None else param.name
        self.board = boards.load(self.name)
        self.port = lease.url if lease is not None else request.config.getoption("kiln_port")
        lab = request.config.getoption("kiln_lab_map") or os.environ.get("KILN_LAB_MAP")
        self.lab_map = None
        if lab:
            from kiln.boards.labmap import load_lab_map
            self.lab_map = load_lab_map(lab)

    def record(self, **figures) -> None:
        """Record figures of this test (JUnit XML properties and the --kiln-results file)."""
        for k, v in figures.items():
            self.request.node.user_properties.append((PREFIX + k, v))

    def run(self, model, inputs: int = 1, golden=None, seed: int = 0, out=None) -> dict:
        """Build ``model`` for this board, run it on ``inputs`` seeded random samples (or the
        inputs of a ``golden`` .npz, then also compared with its outputs) and check every output
        bit for bit against Kiln's reference; returns and records the figures."""
        from kiln import hil
        from kiln.samples import golden_pairs, random_inputs, read_npz
        from kiln.targets import run_reference
        out = out or str(self.request.getfixturevalue("tmp_path") / "kiln_board")
        image, pkg_dir = hil.build_for_board(model, self.board, out, port=self.port, lab_map=self.lab_map)
        graph = hil.package_graph(pkg_dir)
        pairs = golden_pairs(read_npz(golden), os.fspath(golden)) if golden else None
        samples = [p[0] for p in pairs] if pairs else random_inputs(graph, inputs, seed)
        kw = {}
        if self.lease is not None:
            self.lease.flash(image)
            kw["device_kw"] = {"flash": False}
        res = hil.run_on_board(image, pkg_dir, [s if len(s) > 1 else s[0] for s in samples], port=self.port,
                               lab_map=self.lab_map, **kw)
        want = [p[1] for p in pairs] if pairs else run_reference(graph, samples)
        got = [o if isinstance(o, (list, tuple)) else (o,) for o in res.outputs]
        exact = len(got) == len(want) and all(
            len(g) == len(w) and all(np.array_equal(np.asarray(a).reshape(-1), np.asarray(b).reshape(-1))
                                     for a, b in zip(g, w)) for g, w in zip(got, want))
        cycles = None
        if res.ticks and res.ticks[0] and res.timer_hz and not self.board.emulated:
            cycles = int(round(res.ticks[0] / res.timer_hz * self.board.run_clock_hz))
        fig = {"board": self.name, "model": os.path.basename(os.fspath(model)), "samples": len(samples),
               "instructions": next((n for n in res.instructions if n), None),
               "instruction_source": res.instruction_source,
               "estimated_cycles": (res.estimate or {}).get("estimated_cycles"), "cycles": cycles,
               "arena_bytes": res.sizes.get("arena"), "flash_bytes": res.sizes.get("flash_used"),
               "bit_exact": bool(exact)}
        if self.lease is not None:
            fig["labgrid_place"] = self.lease.place_name
        self.record(**fig)
        return fig


@pytest.fixture
def kiln_board(request):
    param = request.param if hasattr(request, "param") else board_params(request.config)[0]
    if param.name:
        from kiln import boards
        reason = _skip_reason(request.node, boards.load(param.name))
        if reason:
            pytest.skip(reason)
        yield KilnBoard(request, param)
        return
    from kiln.boards.farm import FarmSpec, Lease
    spec = FarmSpec(place=param.place, tags=dict(param.tags), wait=request.config.getoption("kiln_wait"))
    with Lease(spec) as lease:
        from kiln import boards
        reason = _skip_reason(request.node, boards.load(lease.board))
        if reason:
            pytest.skip(reason)
        yield KilnBoard(request, param, lease)


def pytest_runtest_logreport(report):
    """Collect the figures (also from pytest-xdist workers: user properties travel with the
    reports)."""
    if report.when != "call":
        return
    fig = {k[len(PREFIX):]: v for k, v in report.user_properties if k.startswith(PREFIX)}
    if fig:
        _session_results.append({"test": report.nodeid, "outcome": report.outcome, **fig})


_session_results: list = []


def pytest_sessionfinish(session):
    path = session.config.getoption("kiln_results")
    if path and not hasattr(session.config, "workerinput"):     # the xdist controller, or no xdist
        with open(path, "w") as f:
            json.dump({"results": _session_results}, f, indent=1, default=str)
