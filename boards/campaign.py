"""Fault-injection campaigns for the serial harness: many inferences under misbehaving boards,
resets and lossy links, each classified as right / clean error / crash / hang / wrong accepted.

    t = fake_board_campaign(trials=2)               # every FakeBoard mode
    t = reset_campaign(image, reference, trials=100)    # QEMU, resets at random moments
    t = targeted_resets(image, reference)           # QEMU, the reset scenarios one by one
    t = noisy_link_campaign(image, reference, loss=0.01, inferences=10, sessions=3)
    print(t.markdown())

A *clean error* is a DeviceError (the harness's own, with a message); a *crash* is any other
exception; a *hang* is a trial still running after its hard timeout; *wrong accepted* is an
output returned that differs from ``reference(inputs)``. The campaigns take a built firmware
image (``image.board``, ``image.elf``) and a reference function, so they import nothing of the
compiler. tests/boards/test_campaigns.py runs them small in CI; benchmarks/link_campaigns.py runs
them big for docs/benchmarks.md.
"""
from __future__ import annotations

import random
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from .device import Device, IOSpec
from .errors import DeviceError
from .fake import MODES, FakeBoard, random_inputs
from .protocol import REPLY, T
from .proxy import FaultProxy
from .qemu import Qemu

OUTCOMES = ("right", "clean_error", "crash", "hang", "wrong_accepted")
Reference = Callable[[list[bytes]], list[bytes]]
BOOT_FRAME_BYTES = 17     # header 7 + payload 6 + CRC 4


@dataclass
class Tally:
    name: str
    counts: dict = field(default_factory=lambda: {k: 0 for k in OUTCOMES})
    seconds: float = 0.0
    examples: dict = field(default_factory=dict)    # outcome -> first few details
    link: dict = field(default_factory=dict)        # summed Device stats

    @property
    def tried(self) -> int:
        return sum(self.counts.values())

    @property
    def ok(self) -> bool:
        """No crash, no hang, no wrong answer accepted."""
        return not (self.counts["crash"] or self.counts["hang"] or self.counts["wrong_accepted"])

    def add(self, outcome: str, detail: str = "", seconds: float = 0.0) -> None:
        self.counts[outcome] += 1
        self.seconds += seconds
        ex = self.examples.setdefault(outcome, [])
        if len(ex) < 3 and detail:
            ex.append(detail[:2000])

    def add_stats(self, stats) -> None:
        for k, v in vars(stats).items():
            if k != "chunk":
                self.link[k] = self.link.get(k, 0) + v

    def merge(self, other: Tally) -> None:
        for k in OUTCOMES:
            self.counts[k] += other.counts[k]
        self.seconds += other.seconds
        for k, v in other.examples.items():
            self.examples.setdefault(k, []).extend(v[:3 - len(self.examples.get(k, []))])
        for k, v in other.link.items():
            self.link[k] = self.link.get(k, 0) + v

    def row(self) -> str:
        c = self.counts
        return (f"| {self.name} | {self.tried} | {c['right']} | {c['clean_error']} | {c['crash']} | "
                f"{c['hang']} | {c['wrong_accepted']} | {self.seconds:.1f} |")

    @staticmethod
    def header() -> str:
        return ("| campaign | tried | right answer | clean error | crash | hang | wrong accepted | seconds |\n"
                "|---|---:|---:|---:|---:|---:|---:|---:|")

    def summary(self) -> str:
        c = self.counts
        lines = [f"{self.name}: tried {self.tried}, right {c['right']}, clean error {c['clean_error']}, "
                 f"crash {c['crash']}, hang {c['hang']}, wrong accepted {c['wrong_accepted']} "
                 f"({self.seconds:.1f} s)"]
        for k in ("crash", "hang", "wrong_accepted"):
            for d in self.examples.get(k, []):
                lines.append(f"  {k}: {d}")
        return "\n".join(lines)


def trial(fn: Callable[[], list[bytes]], expected: Sequence[bytes] | None, *,
          hard_timeout: float, on_hang: Callable[[], None] | None = None) -> tuple[str, str, float]:
    """Run ``fn`` in a thread; (outcome, detail, seconds). ``on_hang`` unblocks a hung trial
    (e.g. closes its device) so that its thread ends."""
    box: dict = {}

    def run():
        try:
            box["out"] = fn()
        except BaseException as e:      # classified below: any exception is a result here
            box["exc"], box["tb"] = e, traceback.format_exc()
    t0 = time.monotonic()
    th = threading.Thread(target=run, name="kiln-campaign-trial", daemon=True)
    th.start()
    th.join(hard_timeout)
    secs = time.monotonic() - t0
    if th.is_alive():
        if on_hang is not None:
            on_hang()
        th.join(5.0)
        return "hang", f"no result after {hard_timeout:.0f} s", secs
    exc = box.get("exc")
    if exc is None:
        out = [bytes(b) for b in box["out"]]
        if expected is not None and out == [bytes(b) for b in expected]:
            return "right", "", secs
        return "wrong_accepted", f"got {[b[:16].hex() for b in out]}", secs
    if isinstance(exc, DeviceError) and str(exc):
        return "clean_error", f"{type(exc).__name__}: {exc}", secs
    return "crash", box["tb"], secs


# ---- the fake board: every misbehaviour --------------------------------------------------------
def fake_board_campaign(trials: int = 2, modes: Sequence[str] | None = None, seed: int = 0,
                        hard_timeout: float = 30.0) -> Tally:
    """Every FakeBoard mode (but wrong-answer, which the protocol cannot detect) ``trials`` times,
    with random input/output counts and sizes: each must end in the right answer or a clean
    error (fake.RIGHT_ANSWER_MODES: the right answer is possible), never a wrong one."""
    rng = random.Random(seed)
    tally = Tally("fake board, every misbehaviour")
    for mode in modes or [m for m in MODES if m != "wrong-answer"]:
        for k in range(trials):
            ins = [rng.randrange(1, 1500) for _ in range(rng.randrange(1, 4))]
            outs = [rng.randrange(1, 1500) for _ in range(rng.randrange(1, 4))]
            with FakeBoard(ins, outs, commands=rng.randrange(1, 80), mode=mode, seed=k) as fb:
                xs = random_inputs(ins, rng.randrange(1 << 30))
                holder: dict = {}

                # draining a 2,000-frame BOOT burst takes the host about 0.5 s on an idle machine:
                # more patience there, so a loaded CI machine still reaches the right answer
                patience = 5.0 if mode == "boot-burst" else 1.0

                def run(patience=patience):
                    dev = holder["dev"] = Device.open(
                        fb.url, timeout=0.3, patience=patience, invoke_timeout=1.0,
                        expect=IOSpec(tuple(ins), tuple(outs), len(fb.cycles)))
                    try:
                        got, _ = dev.infer(xs)
                        dev.get_profile()
                        dev.get_stack()
                        return got
                    finally:
                        tally.add_stats(dev.stats)
                        dev.close()
                outcome, detail, secs = trial(run, fb.expected(xs), hard_timeout=hard_timeout,
                                              on_hang=lambda: holder.get("dev") and holder["dev"].close())
                if fb.errors:
                    outcome, detail = "crash", f"fake board {mode}: {fb.errors[0]}"
                tally.add(outcome, f"[{mode}] {detail}", secs)
    return tally


# ---- QEMU: resets ----------------------------------------------------------------------------
@contextmanager
def _qemu(image, **kw):
    """A Qemu whose logs (and QMP socket) live in a temporary folder removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="kiln-campaign-") as d, Qemu(image, workdir=d, **kw) as q:
        yield q


def _qemu_device(q, px, sizes, **kw) -> Device:
    return Device.open(px.url, log_path=str(q.stderr), expect=IOSpec(*sizes), **kw)


def reset_campaign(image, reference: Reference, input_sizes: Sequence[int],
                   output_sizes: Sequence[int], trials: int = 100, seed: int = 0,
                   max_delay: float = 0.08, boot_loss: float = 0.5, hard_timeout: float = 120.0,
                   name: str = "random resets") -> Tally:
    """One QEMU board (rebooting), one Device, ``trials`` inferences; during each, a reset at a
    random moment in [0, max_delay] s, its BOOT frame dropped with probability ``boot_loss``."""
    rng = random.Random(seed)
    tally = Tally(name)
    with _qemu(image, reboot=True, qmp=True) as q, FaultProxy(q.port, seed=seed) as px:
        dev = _qemu_device(q, px, (tuple(input_sizes), tuple(output_sizes)), timeout=0.5)
        try:
            for _k in range(trials):
                xs = random_inputs(input_sizes, rng.randrange(1 << 30))
                delay, lose = rng.uniform(0, max_delay), rng.random() < boot_loss

                def inject():
                    time.sleep(delay)
                    if lose:
                        px.drop_next("to_host", BOOT_FRAME_BYTES)
                    q.system_reset()
                injector = threading.Thread(target=inject, daemon=True)
                injector.start()
                outcome, detail, secs = trial(lambda: dev.infer(xs)[0], reference(xs),
                                              hard_timeout=hard_timeout, on_hang=dev.close)
                injector.join()
                tally.add(outcome, detail, secs)
                if outcome == "hang":
                    break
                px.clear_faults()
                _settle(dev)
        finally:
            tally.add_stats(dev.stats)
            dev.close()
    return tally


def _settle(dev: Device) -> None:
    """Let a reset that fired after the trial finished be noticed before the next trial."""
    time.sleep(0.02)
    try:
        dev.handshake()
    except DeviceError:
        pass


# Targeted scenarios: (name, direction, frame type, nth frame, when, drop the BOOT frame)
SCENARIOS = [
    ("reset between INVOKE and GET_OUTPUT", "to_device", T.GET_OUTPUT, 1, "before", False),
    ("reset between INVOKE and GET_OUTPUT, BOOT lost", "to_device", T.GET_OUTPUT, 1, "before", True),
    ("reset before INVOKE, BOOT lost (zeroed input)", "to_device", T.INVOKE, 1, "before", True),
    ("reset between SET_INPUT chunks, BOOT lost (partial input)", "to_device", T.SET_INPUT, 2, "before", True),
    ("reset while the model runs, BOOT lost", "to_host", T.ACK, 1, "after", True),
    ("reset after the INVOKE reply, BOOT lost", "to_host", T.INVOKE | REPLY, 1, "after", True),
    ("reset after the INVOKE reply", "to_host", T.INVOKE | REPLY, 1, "after", False),
]


def targeted_resets(image, reference: Reference, input_sizes: Sequence[int],
                    output_sizes: Sequence[int], seed: int = 0, repeat: int = 1,
                    hard_timeout: float = 120.0) -> Tally:
    """Each scenario of SCENARIOS ``repeat`` times: a reset set off by a frame on the wire."""
    tally = Tally("targeted resets")
    with _qemu(image, reboot=True, qmp=True) as q, FaultProxy(q.port, seed=seed) as px:
        dev = _qemu_device(q, px, (tuple(input_sizes), tuple(output_sizes)), timeout=0.5, chunk=256)
        try:
            for r in range(repeat):
                for i, (name, direction, ftype, nth, when, lose) in enumerate(SCENARIOS):
                    xs = random_inputs(input_sizes, seed * 1000 + r * 100 + i)

                    def act(_frame, lose=lose):
                        if lose:
                            px.drop_next("to_host", BOOT_FRAME_BYTES)
                        q.system_reset()
                        time.sleep(0.05)
                    px.on_frame(direction, ftype, act, when=when, count=nth)
                    outcome, detail, secs = trial(lambda: dev.infer(xs)[0], reference(xs),
                                                  hard_timeout=hard_timeout, on_hang=dev.close)
                    tally.add(outcome, f"[{name}] {detail}", secs)
                    if outcome == "hang":
                        return tally
                    px.clear_faults()
                    _settle(dev)
        finally:
            tally.add_stats(dev.stats)
            dev.close()
    return tally


# ---- QEMU: a lossy link ----------------------------------------------------------------------
def noisy_link_campaign(image, reference: Reference, input_sizes: Sequence[int],
                        output_sizes: Sequence[int], loss: float = 0.01, inferences: int = 10,
                        sessions: int = 1, seed: int = 0, hard_timeout: float = 120.0) -> Tally:
    """``sessions`` times: open a Device through a proxy that drops each byte with probability
    ``loss`` in both directions, run ``inferences`` inferences. seconds = the whole sessions,
    handshake included; ``tally.session_seconds`` lists each session's."""
    tally = Tally(f"noisy link, {loss:.1%} byte loss both ways")
    tally.session_seconds = []
    rng = random.Random(seed)
    for s in range(sessions):
        with _qemu(image) as q, FaultProxy(q.port, seed=seed * 7919 + s) as px:
            for d in ("to_device", "to_host"):
                px.set_faults(d, drop=loss)
            t0 = time.monotonic()
            holder: dict = {}

            def session():
                dev = holder["dev"] = _qemu_device(q, px, (tuple(input_sizes), tuple(output_sizes)))
                results = []
                for _ in range(inferences):
                    xs = random_inputs(input_sizes, rng.randrange(1 << 30))
                    results.append(trial(lambda: dev.infer(xs)[0], reference(xs),
                                         hard_timeout=hard_timeout, on_hang=dev.close))
                return results
            try:
                for r in session():
                    tally.add(r[0], r[1], 0.0)
            except DeviceError as e:      # the session could not even be opened
                tally.add("clean_error", f"opening: {e}")
            except Exception:
                tally.add("crash", traceback.format_exc())
            secs = time.monotonic() - t0
            tally.seconds += secs
            tally.session_seconds.append(round(secs, 2))
            if "dev" in holder:
                tally.add_stats(holder["dev"].stats)
                holder["dev"].close()
    return tally
