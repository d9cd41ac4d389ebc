"""Kiln's pytest plugin (kiln/pytest_plugin.py, entry point pytest11): the kiln_board fixture runs
one test on every board given, the markers skip boards by core and memory, and the figures land in
the JUnit XML and in one JSON file. Kiln's own hardware-in-the-loop check below uses the fixture
(pytest --kiln-board B[,B...], --labgrid-tag board=B or --kiln-place PLACE to run it on others)."""
import json
import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET

import pytest

from tests.boards.test_farm_parallel import _dense_model
from tests.firmware import helpers


@pytest.mark.kiln_memory(ram=128 * 1024)
def test_shared_model_is_bit_exact_on_the_board(kiln_board, shared_models):
    """The kws model's golden pairs (LiteRT's reference kernels) on each board given."""
    helpers.need_qemu()
    fig = kiln_board.run(os.path.join(shared_models, "kws_ref_model.tflite"),
                         golden=os.path.join(shared_models, "kws_ref_model.golden.npz"))
    assert fig["bit_exact"], fig
    assert fig["instructions"] or fig["cycles"]
    assert fig["arena_bytes"] > 0 and fig["flash_bytes"] > 0


USER_TESTS = '''
import pytest

MODEL = {model!r}

def test_runs(kiln_board):
    fig = kiln_board.run(MODEL, inputs=2)
    assert fig["bit_exact"]

@pytest.mark.kiln_cores("cortex-m55")
def test_m55_only(kiln_board):
    kiln_board.run(MODEL)

@pytest.mark.kiln_memory(ram=64 * 1024 * 1024)
def test_needs_64_mib(kiln_board):
    kiln_board.run(MODEL)
'''


def test_plugin_in_a_users_suite(tmp_path):
    """A user's suite with only `pip install kiln-ml`: the entry point loads the plugin; the
    figures of every test reach the JSON file and the JUnit XML also from pytest-xdist workers."""
    helpers.need_qemu()
    model = _dense_model(tmp_path / "dense.json")
    (tmp_path / "test_user.py").write_text(textwrap.dedent(USER_TESTS.format(model=model)))
    results, junit = tmp_path / "figures.json", tmp_path / "junit.xml"
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_user.py",
                        "--kiln-board", "mps2-an386,mps3-an547", "--kiln-results", str(results),
                        f"--junitxml={junit}", "-rs", "-n", "2"], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "3 passed, 3 skipped" in p.stdout, p.stdout
    assert "mps2-an386 has a cortex-m4 (test runs on cortex-m55)" in p.stdout
    assert "the test needs 67,108,864" in p.stdout
    rows = json.loads(results.read_text())["results"]
    assert {(r["test"].split("::")[1], r["board"]) for r in rows} == {
        ("test_runs[mps2-an386]", "mps2-an386"), ("test_runs[mps3-an547]", "mps3-an547"),
        ("test_m55_only[mps3-an547]", "mps3-an547")}
    assert all(r["bit_exact"] is True and r["instructions"] > 0 and r["arena_bytes"] > 0 for r in rows)
    props = {(tc.get("name"), p.get("name")): p.get("value") for tc in ET.parse(junit).iter("testcase")
             for p in tc.iter("property")}
    assert props[("test_runs[mps2-an386]", "kiln_bit_exact")] == "True"
    assert int(props[("test_runs[mps3-an547]", "kiln_instructions")]) > 0


class _Config:
    def __init__(self, **opts):
        self.opts = {"kiln_place": [], "labgrid_tag": [], "kiln_board": None, **opts}

    def getoption(self, name):
        return self.opts[name]


def test_board_params_from_the_options():
    from kiln.pytest_plugin import board_params
    assert [p.id for p in board_params(_Config())] == ["mps2-an386"]           # the default
    got = board_params(_Config(kiln_place=["lab-1"], labgrid_tag=["board=rpi-pico,bench=b2"],
                               kiln_board="mps2-an385"))
    assert [p.id for p in got] == ["place=lab-1", "bench=b2,board=rpi-pico", "mps2-an385"]
    assert [p.id for p in board_params(_Config(labgrid_tag=["board=x"]))] == ["board=x"]   # farm only
