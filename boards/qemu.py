"""Launch a firmware image in QEMU and hand back a :class:`~kiln.boards.device.Device` for it.

    with Qemu(image) as q:                     # image: kiln.firmware.Image
        dev = q.device()
        out, res = dev.run(x)
        res.instructions, res.ticks

QEMU runs with ``-icount shift=N,align=off,sleep=off`` (deterministic SysTick), the serial port
as a TCP server on a free local port (``wait=on``: the CPU starts when the host connects, so no
boot output is lost), semihosting for the exit code, ``-no-reboot`` and the instruction-count
plugin, which leaves out the code whose instructions depend on when interrupts arrive
(:func:`uncounted_ranges`). It is stopped on every path: context exit, :meth:`stop`, garbage collection and
interpreter exit.
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import weakref
from pathlib import Path

from kiln.common.errors import KilnError

from .device import Device
from .elf import Elf
from .schema import Board

DEFAULT_SHIFT = 6
VECTORS = "kiln_vectors"        # the firmware's vector table (firmware/templates/startup.c.j2)
# called inside the measured window, but how many instructions it runs depends on when the
# SysTick interrupt lands: it reads the wrap count again when one arrived mid-read
UNCOUNTED = ("kiln_timer_now",)


class QemuError(KilnError, RuntimeError):
    pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def qemu_binary() -> str:
    path = shutil.which("qemu-system-arm")
    if not path:
        raise QemuError("qemu-system-arm not found on PATH: install qemu-system-arm "
                        "(bash scripts/setup.sh does it)")
    return path


def command(board: Board, elf: str | Path, port: int, *, icount_shift: int | None = DEFAULT_SHIFT,
            plugin: str | Path | None = None, markers: dict[str, int] | None = None,
            plugin_out: str | Path | None = None, log: str | Path | None = None,
            semihosting: bool = True, reboot: bool = False,
            qmp: str | Path | None = None,
            uncounted: list[tuple[str, int, int]] | None = None) -> list[str]:
    """The qemu-system-arm command line for ``board`` (its ``qemu`` table) running ``elf``.
    ``uncounted``: code the plugin leaves out, (name, start, end) ranges (default: those of
    :func:`uncounted_ranges` for ``elf``)."""
    cmd = [qemu_binary(), "-M", board.qemu.machine, "-nographic", "-monitor", "none",
           "-kernel", str(elf), *([] if reboot else ["-no-reboot"]),
           "-serial", f"tcp:127.0.0.1:{port},server=on,wait=on,nodelay=on"]
    if icount_shift is not None:
        cmd += ["-icount", f"shift={icount_shift},align=off,sleep=off"]
    if semihosting:
        cmd += ["-semihosting-config", "enable=on,target=native"]
    if plugin is not None:
        m = markers or {}
        args = [f"{k}=0x{m['kiln_marker_' + k]:x}" for k in ("begin", "end", "mark")
                if "kiln_marker_" + k in m]
        if uncounted is None:
            uncounted = uncounted_ranges(elf)
        args += [f"skip=0x{lo:x}-0x{hi:x}" for _, lo, hi in uncounted]
        if plugin_out is not None:
            args.append(f"out={plugin_out}")
        cmd += ["-plugin", ",".join([str(plugin), *args]), "-d", "plugin"]
    if log is not None:
        cmd += ["-D", str(log)]
    if qmp is not None:     # a control socket: Qemu.system_reset() (fault-injection campaigns)
        cmd += ["-qmp", f"unix:{qmp},server=on,wait=off"]
    cmd += list(board.qemu.extra_args)
    return cmd


def uncounted_ranges(elf: str | Path) -> list[tuple[str, int, int]]:
    """(name, start, end) of the functions whose instructions the plugin does not count: the
    exception handlers of the vector table (all but the reset handler; the SysTick wrap and UART
    receive interrupts arrive at moments that depend on the host, not on the inference) and
    :data:`UNCOUNTED`. An inference then counts the same instructions whenever interrupts
    land in it. The handlers must not call other code (the firmware's are leaf functions,
    tests/firmware/test_icount_interrupts.py checks it)."""
    e = Elf.read(elf)
    funcs = {s.address & ~1: (name, s) for name, s in sorted(e.symbols.items()) if s.func and s.size}
    starts = set()
    vec = e.symbols.get(VECTORS)
    if vec is not None and vec.size >= 8:
        starts |= {w & ~1 for w in e.words(vec.address, vec.size // 4)[2:] if w & 1}
    starts |= {e.symbols[n].address & ~1 for n in UNCOUNTED if n in e.symbols}
    return [(funcs[a][0], a, a + funcs[a][1].size) for a in sorted(starts) if a in funcs]


_live: weakref.WeakSet[Qemu] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for q in list(_live):
        q.stop()


class Qemu:
    """One QEMU process running one image. ``image`` is a kiln.firmware.Image (or pass
    ``elf=``/``board=``/``markers=`` directly). ``plugin``: the instruction-count plugin (a path),
    True for the image's own (``image.qemu_plugin``), or None/False for none. ``uncounted``: the
    code the plugin leaves out (default: :func:`uncounted_ranges`; ``[]`` counts everything,
    interrupt handlers included)."""

    def __init__(self, image=None, *, board: Board | None = None, elf: str | Path | None = None,
                 markers: dict[str, int] | None = None, icount_shift: int | None = DEFAULT_SHIFT,
                 plugin: bool | str | Path = True, workdir: str | Path | None = None,
                 semihosting: bool | None = None, reboot: bool = False, qmp: bool = False,
                 uncounted: list[tuple[str, int, int]] | None = None):
        self.board = board or image.board
        self.elf = Path(elf or image.elf)
        self.markers = markers if markers is not None else (image.markers if image else {})
        self.icount_shift = icount_shift
        self.uncounted = uncounted
        self.reboot = reboot    # False: a system reset ends QEMU (-no-reboot); True: it reboots
        self.semihosting = semihosting if semihosting is not None else (
            image.semihosting if image is not None else True)
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="kiln-qemu-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log = self.workdir / "qemu.log"
        self.icount_log = self.workdir / "icount.log"
        self.stdout = self.workdir / "qemu.stdout"
        self.qmp_path = self.workdir / "qmp.sock" if qmp else None
        self._qmp = None
        self.stderr = self.workdir / "qemu.stderr"
        if plugin is True:      # the image's own plugin (kiln.firmware.Image.qemu_plugin), if it has one
            plugin = getattr(image, "qemu_plugin", None)
        self.plugin = Path(plugin) if plugin else None
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self._icount_pos = 0
        self._icount_buf = ""
        self.started_at = None
        self._files = []

    @property
    def url(self) -> str:
        return f"socket://127.0.0.1:{self.port}"

    def start(self) -> Qemu:
        for _ in range(5):
            self.port = free_port()
            cmd = command(self.board, self.elf, self.port, icount_shift=self.icount_shift,
                          plugin=self.plugin if self.markers else None, markers=self.markers,
                          plugin_out=self.icount_log, log=self.log, semihosting=self.semihosting,
                          reboot=self.reboot, qmp=self.qmp_path, uncounted=self.uncounted)
            self.cmd = cmd
            out = open(self.stdout, "wb")
            err = open(self.stderr, "wb")
            self._files = [out, err]
            self.started_at = time.monotonic()
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
            _live.add(self)
            if self._wait_listening(5.0):
                return self
            rc = self.proc.poll()
            text = self.stderr.read_text(errors="replace")
            self.stop()
            if "Address already in use" not in text:
                raise QemuError(f"QEMU did not start (exit {rc}):\n  {' '.join(cmd)}\n{text[-2000:]}")
        raise QemuError("QEMU could not bind a free TCP port after 5 tries")

    def _wait_listening(self, timeout: float) -> bool:
        """QEMU listens before it runs the guest; wait for the socket (not connecting to it:
        the one connection the server accepts belongs to the Device). The listening socket
        must be this QEMU's own (its inode among the process's file descriptors): with several
        QEMUs starting at once (kiln bench -j, pytest -n), another one may have taken the port
        this one was given, and the Device must never connect to someone else's board."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                if _owns_listener(self.proc.pid, self.port):
                    return True
            except OSError:
                time.sleep(0.05)
                return True
            time.sleep(0.01)
        return False

    def device(self, **kw):
        """A Device connected to this QEMU (instruction counts come from the plugin)."""
        if self.proc is None:
            self.start()
        kw.setdefault("log_path", str(self.stderr))
        if self.plugin is not None and self.markers:
            kw.setdefault("instruction_counter", self.next_window)
        elif self.icount_shift is not None:
            kw.setdefault("icount_fallback", self.ticks_to_instructions)
        return Device.open(kw.pop("url", self.url), **kw)

    def ticks_to_instructions(self, ticks: int) -> int:
        """Fallback when the plugin is not available: under -icount shift=N each instruction
        is 2^N ns of virtual time and SysTick counts at the board clock (docs/QEMU_BOARDS.md)."""
        shift = self.icount_shift or 0
        return round(ticks * 1e9 / (self.board.clock_hz * (1 << shift)))

    def next_window(self, timeout: float) -> tuple[int, list[int]] | None:
        """The next 'kiln-icount: window=' line from the plugin: (instructions, marks).
        timeout=0 discards whatever is already there and returns None."""
        deadline = time.monotonic() + timeout
        while True:
            if self.icount_log.exists():
                with open(self.icount_log) as f:
                    f.seek(self._icount_pos)
                    chunk = f.read()
                    self._icount_pos = f.tell()
                self._icount_buf += chunk
            lines = self._icount_buf.split("\n")
            self._icount_buf = lines.pop()
            found = None
            for line in lines:
                if line.startswith("kiln-icount: window="):
                    found = _parse_window(line)
            if timeout == 0:
                return None
            if found is not None:
                return found
            if time.monotonic() >= deadline or (self.proc and self.proc.poll() is not None):
                return None
            time.sleep(0.005)

    def system_reset(self) -> None:
        """Reset the emulated board now, as a reset button would (needs ``qmp=True``; with
        ``reboot=False`` QEMU exits instead)."""
        if self.qmp_path is None:
            raise QemuError("system_reset needs Qemu(..., qmp=True)")
        if self._qmp is None:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(5.0)
            s.connect(str(self.qmp_path))
            self._qmp_sock = s
            self._qmp = s.makefile("rwb", buffering=0)
            self._qmp_call("qmp_capabilities", greeting=True)
        self._qmp_call("system_reset")

    def _qmp_call(self, command: str, greeting: bool = False) -> None:
        f = self._qmp
        if greeting:
            f.readline()
        f.write(json.dumps({"execute": command}).encode() + b"\n")
        for _ in range(100):     # skip asynchronous events until the answer
            line = f.readline()
            if not line:
                raise QemuError(f"QMP connection closed during {command}{self._logs()}")
            msg = json.loads(line)
            if "return" in msg:
                return
            if "error" in msg:
                raise QemuError(f"QMP {command}: {msg['error']}{self._logs()}")
        raise QemuError(f"QMP {command}: no answer among 100 messages{self._logs()}")

    def wait(self, timeout: float = 10.0) -> int:
        """Wait for QEMU to exit (e.g. after Device.exit()); returns its exit code."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise QemuError(f"QEMU still running after {timeout} s{self._logs()}") from None

    def _logs(self) -> str:
        return f" (stderr: {self.stderr}, log: {self.log})"

    def stop(self) -> None:
        p = self.proc
        if p is not None and p.poll() is None:
            p.terminate()
            try:
                p.wait(2)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(2)
        for f in self._files + [x for x in (self._qmp, getattr(self, "_qmp_sock", None)) if x]:
            try:
                f.close()
            except Exception:
                pass
        self._files = []
        self._qmp = self._qmp_sock = None
        _live.discard(self)

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def __enter__(self) -> Qemu:
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __del__(self):
        try:
            self.stop()
        except Exception:
            pass


def _owns_listener(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds a TCP socket listening on ``port`` (Linux /proc)."""
    with open("/proc/net/tcp") as f:
        inodes = {fields[9] for fields in (line.split() for line in f)
                  if len(fields) > 9 and fields[1].endswith(f":{port:04X}") and fields[3] == "0A"}
    if not inodes:
        return False
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            link = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in inodes:
            return True
    return False


def _parse_window(line: str) -> tuple[int, list[int]]:
    fields = dict(kv.split("=", 1) for kv in line.split(":", 1)[1].split())
    marks = [int(x) for x in fields.get("marks", "").split(",") if x]
    return int(fields["insns"]), marks
