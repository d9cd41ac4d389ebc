"""A real labgrid farm on 127.0.0.1: a real labgrid-coordinator, a real labgrid-exporter serving an
emulated board's serial port (QEMU on a pseudo-terminal) over RFC 2217 through ser2net, as a
Raspberry Pi serves a USB board's. `kiln verify --labgrid PLACE` must be bit-exact (exit 0), a
wrong golden a mismatch (exit 1); a busy place and an unreachable coordinator clear errors (exit 2);
a second client waiting for the place gets it once it is released; a client killed with SIGKILL
leaves no place locked.

Against a real farm: LG_COORDINATOR=host:port KILN_FARM_PLACE=PLACE (a place tagged
board=<a Kiln board>) runs the same tests on it without starting anything locally.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from kiln import hil
from kiln.boards import qemu as Q
from kiln.boards.farm import CoordinatorUnreachable, FarmError, FarmSpec, Lease, PlaceBusy, parse_tags
from kiln.cli import main

pytest.importorskip("labgrid", reason="the farm extra is not installed (pip install 'kiln-ml[farm]')")

MODEL = "kws_ref_model"
BOARD = "mps2-an386"
BIN = os.path.dirname(sys.executable)


def _tool(name):
    path = os.path.join(BIN, name)
    return path if os.path.exists(path) else shutil.which(name)


def _wait_for(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _client(address, *args):
    return subprocess.run([_tool("labgrid-client"), "-x", address, *args], capture_output=True, text=True,
                          timeout=60)


class LocalFarm:
    """Coordinator + exporter + QEMU on 127.0.0.1, each on its own port and folder."""

    def __init__(self, tmp, image):
        self.tmp = tmp
        self.procs = []
        self.port = Q.free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.place = f"kiln-{os.getpid()}-{self.port}"
        self.image = image

    def _spawn(self, name, cmd):
        log = open(self.tmp / f"{name}.log", "wb")
        p = subprocess.Popen(cmd, cwd=self.tmp, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append((p, log))
        return p

    def log(self, name):
        return (self.tmp / f"{name}.log").read_text(errors="replace")[-3000:]

    def start(self):
        if not (shutil.which("ser2net") or os.path.exists("/usr/sbin/ser2net")):
            pytest.skip("ser2net not installed (bash scripts/setup.sh --test installs it)")
        self._spawn("coordinator", [_tool("labgrid-coordinator"), "-l", self.address])
        _wait_for(lambda: _client(self.address, "places").returncode == 0, 30,
                  f"the coordinator at {self.address}\n{self.log('coordinator')}")
        pty = self._start_qemu()
        (self.tmp / "exporter.yaml").write_text(
            f"kiln-board:\n  RawSerialPort:\n    port: {pty}\n    speed: 115200\n")
        self._spawn("exporter", [_tool("labgrid-exporter"), "-c", self.address, "-n", "kiln-exporter",
                                 "--hostname", "127.0.0.1", str(self.tmp / "exporter.yaml")])
        _wait_for(lambda: "NetworkSerialPort" in _client(self.address, "resources").stdout, 30,
                  f"the exporter's resources\n{self.log('exporter')}")
        for args in (["create"], ["add-match", "kiln-exporter/kiln-board/*"], ["set-tags", f"board={BOARD}"]):
            r = _client(self.address, "-p", self.place, *args)
            assert r.returncode == 0, r.stderr
        return self

    def _start_qemu(self):
        """The board: QEMU running the model's firmware, its UART on a pseudo-terminal (as a
        USB board's on /dev/ttyACM0)."""
        cmd = Q.command(self.image.board, self.image.elf, 0, semihosting=True)
        cmd[cmd.index("-serial") + 1] = "pty"
        p = self._spawn("qemu", cmd)
        text = _wait_for(lambda: re.search(r"redirected to (/dev/pts/\d+)", self.log("qemu")), 30,
                         "QEMU's pseudo-terminal")
        assert p.poll() is None, self.log("qemu")
        return text.group(1)

    def stop(self):
        for p, log in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
            log.close()


@pytest.fixture(scope="module")
def farm(tmp_path_factory, shared_models):
    """(coordinator address, place name): a real farm given LG_COORDINATOR and KILN_FARM_PLACE, else
    a local one started here."""
    if os.environ.get("LG_COORDINATOR") and os.environ.get("KILN_FARM_PLACE"):
        yield os.environ["LG_COORDINATOR"], os.environ["KILN_FARM_PLACE"]
        return
    tmp = tmp_path_factory.mktemp("farm")
    image, _ = hil.build_for_board(os.path.join(shared_models, f"{MODEL}.tflite"), BOARD, tmp / "build")
    f = LocalFarm(tmp, image)
    try:
        f.start()
        yield f.address, f.place
    finally:
        f.stop()


@pytest.fixture
def golden(shared_models):
    return os.path.join(shared_models, f"{MODEL}.golden.npz")


def _verify(farm, model, golden, *extra):
    address, place = farm
    return main(["verify", model, "--golden", golden, "--labgrid", place, "--lg-coordinator", address, *extra])


def _acquired_by(address, place):
    r = _client(address, "-p", place, "show")
    m = re.search(r"acquired: (\S+)", r.stdout)
    return None if m is None or m.group(1) == "None" else m.group(1)


def test_verify_through_the_farm_is_bit_exact(farm, shared_models, golden, capsys):
    rc = _verify(farm, os.path.join(shared_models, f"{MODEL}.tflite"), golden, "--json")
    out = capsys.readouterr().out
    assert rc == 0, out
    assert '"matched": ' in out and '"place": "' + farm[1] + '"' in out and "rfc2217://" in out
    assert _acquired_by(*farm) is None          # released afterwards


def test_verify_through_the_farm_reports_a_wrong_golden(farm, shared_models, golden, tmp_path, capsys):
    data = dict(np.load(golden))
    key = next(k for k in sorted(data) if k.startswith("out_"))
    flat = data[key].reshape(-1).copy()
    flat[0] = flat[0] + 1 if flat[0] < 127 else flat[0] - 1
    data[key] = flat.reshape(data[key].shape)
    bad = tmp_path / "wrong.golden.npz"
    np.savez(bad, **data)
    rc = _verify(farm, os.path.join(shared_models, f"{MODEL}.tflite"), str(bad))
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "FAILED" in out
    assert _acquired_by(*farm) is None


def test_run_and_bench_through_the_farm(farm, shared_models, capsys):
    address, place = farm
    model = os.path.join(shared_models, f"{MODEL}.tflite")
    common = ["--labgrid", place, "--lg-coordinator", address, "--json"]
    rc = main(["run", model, "--inputs", "2", *common])
    rep = json.loads(capsys.readouterr().out)
    assert rc == 0 and rep["bit_exact"] and rep["samples"] == 2, rep
    assert rep["labgrid"]["place"] == place and rep["board"] == rep["labgrid"]["board"]
    rc = main(["bench", "--models", model, "--optimize", "size", *common])
    rep = json.loads(capsys.readouterr().out)
    assert rc == 0 and [r["board"] for r in rep["rows"]] == [rep["labgrid"]["board"]], rep
    assert rep["rows"][0]["bit_exact"] and rep["rows"][0]["arena_bytes"] > 0
    assert _acquired_by(address, place) is None


def test_verify_with_an_environment_file(farm, shared_models, golden, tmp_path, capsys):
    """--lg-env: the place (RemotePlace), the Kiln board and the coordinator from labgrid's
    environment file; it configures no flashing driver, so Kiln's own flasher is used."""
    address, place = farm
    with Lease(FarmSpec(place=place, coordinator=address, wait=30)) as lease:
        board = lease.board
    env = tmp_path / "env.yaml"
    env.write_text(f"options:\n  coordinator_address: {address}\ntargets:\n  main:\n    resources:\n"
                   f"      RemotePlace:\n        name: {place}\n    options:\n      kiln_board: {board}\n")
    rc = main(["verify", os.path.join(shared_models, f"{MODEL}.tflite"), "--golden", golden,
               "--lg-env", str(env), "--json"])
    rep = json.loads(capsys.readouterr().out)
    assert rc == 0 and rep["ok"] and rep["labgrid"] == {"place": place, "board": board, "coordinator": address,
                                                        "url": rep["labgrid"]["url"]}, rep
    assert _acquired_by(address, place) is None


def test_busy_place_is_an_error_and_a_waiting_client_gets_it(farm, shared_models, golden, capsys):
    address, place = farm
    first = Lease(FarmSpec(place=place, coordinator=address)).__enter__()
    try:
        assert _acquired_by(address, place) == first.user
        rc = _verify(farm, os.path.join(shared_models, f"{MODEL}.tflite"), golden)
        err = capsys.readouterr().err
        assert rc == 2 and "busy" in err and "--labgrid-wait" in err, err
        got = {}

        def second():
            try:
                with Lease(FarmSpec(place=place, coordinator=address, wait=60)) as lease:
                    got["place"] = lease.place_name
                    got["held_by"] = _acquired_by(address, place)
                    got["board"] = lease.board
            except Exception as e:       # reported below, in the test's thread
                got["error"] = e
        t = threading.Thread(target=second)
        t.start()
        time.sleep(2.0)
        assert t.is_alive() and "place" not in got      # waiting: the place is still held
    finally:
        first.close()
    t.join(90)
    assert not t.is_alive() and "error" not in got, got
    assert got["place"] == place and got["held_by"] is not None and got["board"]
    assert _acquired_by(address, place) is None


def test_place_by_tag(farm):
    address, place = farm
    with Lease(FarmSpec(place=place, coordinator=address, wait=30)) as lease:
        board = lease.board
    tags = parse_tags([f"board={board}"])
    with Lease(FarmSpec(tags=tags, coordinator=address, wait=30)) as lease:
        assert lease.board == board and lease.url.startswith(("rfc2217://", "socket://"))
        assert _acquired_by(address, lease.place_name) == lease.user


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["ctrl-c", "term", "kill"])
def test_an_interrupted_or_killed_client_leaves_no_place_locked(farm, sig):
    """Ctrl-C and SIGTERM end the lease's `with` block (released at once); SIGKILL leaves it to
    the guard process."""
    address, place = farm
    script = ("import os, signal, sys, time\n"
              "from kiln.boards.farm import FarmSpec, Lease\n"
              f"with Lease(FarmSpec(place={place!r}, coordinator={address!r}, wait=30)):\n"
              "    print('acquired', flush=True)\n"
              f"    os.kill(os.getpid(), {int(sig)})\n"
              "    time.sleep(60)\n"
              "print('not reached', flush=True)\n")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "acquired" in p.stdout and "not reached" not in p.stdout, p.stdout + p.stderr
    assert p.returncode != 0
    _wait_for(lambda: _acquired_by(address, place) is None, 30, "the place to be released")


def test_unreachable_coordinator_is_a_clear_error(shared_models, golden, capsys):
    rc = main(["verify", os.path.join(shared_models, f"{MODEL}.tflite"), "--golden", golden,
               "--labgrid", "anywhere", "--lg-coordinator", f"127.0.0.1:{Q.free_port()}"])
    err = capsys.readouterr().err
    assert rc == 2 and "cannot reach the labgrid coordinator" in err and "LG_COORDINATOR" in err, err
    with pytest.raises(CoordinatorUnreachable):
        Lease(FarmSpec(place="x", coordinator=f"127.0.0.1:{Q.free_port()}")).__enter__()


def test_bad_tags_and_missing_names_are_usage_errors():
    with pytest.raises(FarmError, match="key=value"):
        parse_tags(["Board=x"])
    with pytest.raises(FarmError, match="name a place"):
        Lease(FarmSpec())
    assert issubclass(PlaceBusy, FarmError)
