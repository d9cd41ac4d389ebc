"""The serial harness of protocol v1 (commit feb22c6, before the fixes) under the faults of
benchmarks/link_campaigns.py: the "before" figures in docs/benchmarks.md. It imports the OLD
code, so it runs from an export of that commit laid out as an importable package:

    git archive feb22c6 | tar -x -C /tmp/v1
    mkdir -p /tmp/v1/pkg/kiln && cp -r /tmp/v1/kiln/* /tmp/v1/pkg/kiln/
    for d in frontend autodiff training quantize backends firmware boards; do
        ln -sfn /tmp/v1/$d /tmp/v1/pkg/kiln/$d; done
    cd /tmp && PYTHONPATH=/tmp/v1/pkg .venv/bin/python benchmarks/link_campaigns_v1.py targeted 1
    ... random 1500 | noisy 3

Resets go through QEMU's QMP socket (v1's Qemu has none: the command line is extended here);
the targeted scenarios are set off by wrapping the v1 Device's write/read (v1's proxy has no
frame triggers). Trials are classified as in kiln.boards.campaign.
"""
import json
import os
import pathlib
import random
import socket
import sys
import threading
import time
import traceback

import kiln

sys.path.insert(0, str(pathlib.Path(kiln.__file__).resolve().parents[2] / "tests" / "firmware" / "fixtures"))
import make_tiny_dense as tiny
import numpy as np

import kiln.boards.qemu as Q
from kiln.boards.device import Device, DeviceError
from kiln.boards.protocol import VERSION
from kiln.boards.proxy import FaultProxy
from kiln.firmware import build

assert VERSION == 1, "run this with the v1 export on PYTHONPATH (see the docstring)"

orig_command = Q.command
def command(*a, **kw):
    cmd = orig_command(*a, **kw)
    return cmd + ["-qmp", f"unix:{os.environ['QMP']},server=on,wait=off"]
Q.command = command

class Qmp:
    def __init__(self, path):
        s = socket.socket(socket.AF_UNIX); s.connect(path); self.f = s.makefile("rwb", buffering=0)
        self.f.readline(); self.call("qmp_capabilities")
    def call(self, c):
        self.f.write(json.dumps({"execute": c}).encode() + b"\n")
        while "return" not in json.loads(self.f.readline()): pass

def ref(x): return tiny.reference(np.frombuffer(x, np.int8)).tobytes()

def trial(fn, expected, hard=120):
    box = {}
    def run():
        try: box["out"] = fn()
        except BaseException as e: box["exc"] = e; box["tb"] = traceback.format_exc()
    th = threading.Thread(target=run, daemon=True); th.start(); th.join(hard)
    if th.is_alive(): return "hang"
    if "exc" in box: return "clean_error" if isinstance(box["exc"], DeviceError) else "crash"
    return "right" if box["out"] == expected else "wrong_accepted"

def tally(name, outcomes, secs):
    c = {k: outcomes.count(k) for k in ("right", "clean_error", "crash", "hang", "wrong_accepted")}
    print(f"| {name} | {len(outcomes)} | {c['right']} | {c['clean_error']} | {c['crash']} | {c['hang']} | {c['wrong_accepted']} | {secs:.1f} |", flush=True)

img = build(tiny.PKG, "mps2-an386", "/tmp/kiln-v1-fw")
which = sys.argv[1]
rng = random.Random(6)
if which == "random":
    n = int(sys.argv[2])
    os.environ["QMP"] = "/tmp/kiln-v1-qmp1.sock"
    with Q.Qemu(img, reboot=True) as q, FaultProxy(q.port, seed=6) as px:
        dev = Device.open(px.url, timeout=0.5); qmp = Qmp(os.environ["QMP"])
        outs, t0 = [], time.monotonic()
        for _k in range(n):
            x = bytes(rng.randrange(256) for _ in range(640))
            delay, lose = rng.uniform(0, 0.08), rng.random() < 0.5
            def inject():
                time.sleep(delay)
                if lose: px.drop_next("to_host", 17)   # v1 BOOT frame: 7 + 6 + 4 B
                qmp.call("system_reset")
            th = threading.Thread(target=inject); th.start()
            outs.append(trial(lambda: dev.run(x)[0], ref(x))); th.join()
            if outs[-1] == "hang": break
            px.clear_faults(); time.sleep(0.02)
            try: dev.handshake()
            except Exception: pass
        tally("random resets, BOOT lost half the time (v1)", outs, time.monotonic() - t0)
elif which == "targeted":
    os.environ["QMP"] = "/tmp/kiln-v1-qmp2.sock"
    # (name, frame type on the wire to the board or from it, nth, drop the BOOT)
    scen = [("GET_OUTPUT", 0x05, "dev", 1, False), ("GET_OUTPUT", 0x05, "dev", 1, True), ("INVOKE", 0x04, "dev", 1, True),
            ("SET_INPUT#2", 0x03, "dev", 2, True), ("ACK", 0x7E, "host", 1, True), ("INVOKE_REPLY", 0x84, "host", 1, True),
            ("INVOKE_REPLY", 0x84, "host", 1, False)]
    with Q.Qemu(img, reboot=True) as q, FaultProxy(q.port, seed=5) as px:
        dev = Device.open(px.url, timeout=0.5, chunk=256); qmp = Qmp(os.environ["QMP"])
        outs, t0 = [], time.monotonic()
        for _r in range(int(sys.argv[2])):
            for name, t, direction, nth, lose in scen:
                x = bytes(rng.randrange(256) for _ in range(640))
                state = {"n": nth, "done": False}
                def act():
                    if state["done"]: return
                    state["n"] -= 1
                    if state["n"] == 0:
                        state["done"] = True
                        if lose: px.drop_next("to_host", 17)
                        qmp.call("system_reset"); time.sleep(0.05)
                w_orig = dev._write
                r_orig = dev._read_frames
                def w(data, t=t, direction=direction):
                    if direction == "dev" and len(data) > 4 and data[4] == t: act()
                    w_orig(data)
                def rf(deadline, t=t, direction=direction):
                    fr = r_orig(deadline)
                    if direction == "host" and any(f.type == t for f in fr): act()
                    return fr
                dev._write, dev._read_frames = w, rf
                outs.append(trial(lambda: dev.run(x)[0], ref(x)))
                print(name, lose, outs[-1], flush=True)
                dev._write, dev._read_frames = w_orig, r_orig
                time.sleep(0.02)
                try: dev.handshake()
                except Exception: pass
        tally("targeted resets (v1)", outs, time.monotonic() - t0)
elif which == "noisy":
    os.environ["QMP"] = "/tmp/kiln-v1-qmp3.sock"
    outs, secs = [], []
    for s in range(int(sys.argv[2])):
        with Q.Qemu(img) as q, FaultProxy(q.port, seed=7 * 7919 + s) as px:
            for d in ("to_device", "to_host"): px.set_faults(d, drop=0.01)
            t0 = time.monotonic()
            try:
                dev = Device.open(px.url)
                for _k in range(10):
                    x = bytes(rng.randrange(256) for _ in range(640))
                    outs.append(trial(lambda: dev.run(x)[0], ref(x), hard=300))
            except DeviceError:
                outs.append("clean_error")
            secs.append(time.monotonic() - t0)
            print("session", s, round(secs[-1], 1), outs[-10:], flush=True)
    tally("noisy link 1% (v1)", outs, sum(secs)); print(secs)
