"""Fault-injection campaigns of the serial harness at full size (boards/campaign.py), printed as
the Markdown table in docs/benchmarks.md ("Board link: fault injection").

    .venv/bin/python benchmarks/link_campaigns.py --shared DIR    # everything (~15 minutes)
    .venv/bin/python benchmarks/link_campaigns.py --only noisy-kws --shared DIR --sessions 3

Campaigns: every fake-board misbehaviour; resets set off by chosen frames on the wire (QEMU,
the tiny_dense fixture); resets at random moments with the BOOT frame lost half the time; 1%
byte loss both ways with the fixture (640-byte input) and with the MLPerf Tiny keyword-spotting
model (490-byte input, compiled by Kiln for mps2-an386), 10 inferences per session. The
reference of each trial is the same C package run on the host (bit-exact with the int8
reference, tested elsewhere): the campaigns test the link, not the compiler.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "firmware", "fixtures"))

import make_tiny_dense as tiny  # noqa: E402

from kiln import hil  # noqa: E402
from kiln.boards import campaign as C  # noqa: E402


def fixture(tmp):
    from kiln.firmware import build
    image = build(tiny.PKG, "mps2-an386", os.path.join(tmp, "fixture"))
    return image, (lambda xs: [tiny.reference(np.frombuffer(xs[0], np.int8)).tobytes()]), ([640], [10])


def kws(shared, tmp):
    from kiln.backends.host import HostModel
    out = os.path.join(tmp, "kws")
    image, pkg = hil.build_for_board(os.path.join(shared, "models", "kws_ref_model.tflite"), "mps2-an386", out)
    man = hil.read_manifest(pkg)
    host = HostModel(pkg)

    def reference(xs):
        arrays = [np.frombuffer(b, t.dtype).reshape(t.shape) for b, t in zip(xs, man.inputs)]
        return [np.ascontiguousarray(o).tobytes() for o in host.run(*arrays)]
    return image, reference, ([t.bytes for t in man.inputs], [t.bytes for t in man.outputs])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shared", default=os.environ.get("KILN_SHARED"),
                   help="folder with models/kws_ref_model.tflite (default: $KILN_SHARED)")
    p.add_argument("--only", default=None, choices=["fake", "targeted", "random", "noisy-fixture", "noisy-kws"],
                   help="run one campaign only")
    p.add_argument("--trials", type=int, default=1500, help="random-reset trials (default: 1500)")
    p.add_argument("--sessions", type=int, default=10,
                   help="noisy-link sessions of 10 inferences each (default: 10)")
    args = p.parse_args(argv)
    if (args.only in (None, "noisy-kws")) and not args.shared:
        p.error("the keyword-spotting campaign needs --shared DIR (or KILN_SHARED) with models/kws_ref_model.tflite")
    with tempfile.TemporaryDirectory(prefix="kiln-campaigns-") as tmp:
        run_campaigns(args, tmp)


def run_campaigns(args, tmp):
    rows, notes = [], []
    todo = [args.only] if args.only else ["fake", "targeted", "random", "noisy-fixture", "noisy-kws"]
    fx = fixture(tmp) if set(todo) & {"targeted", "random", "noisy-fixture"} else None
    for name in todo:
        t0 = time.monotonic()
        if name == "fake":
            t = C.fake_board_campaign(trials=20, seed=2)
        elif name == "targeted":
            t = C.targeted_resets(fx[0], fx[1], *fx[2], repeat=20, seed=5)
        elif name == "random":
            t = C.reset_campaign(fx[0], fx[1], *fx[2], trials=args.trials, seed=6,
                                 name="random resets, BOOT lost half the time")
        else:
            image, ref, io = fx if name == "noisy-fixture" else kws(args.shared, tmp)
            t = C.noisy_link_campaign(image, ref, *io, loss=0.01, inferences=10, sessions=args.sessions,
                                      seed=7)
            label = "tiny_dense, 640 B input" if name == "noisy-fixture" else "kws_ref_model, 490 B input"
            t.name = f"{t.name}, {label}"
            s = t.session_seconds
            notes.append(f"{label}: 10 inferences per session in {min(s):.1f} / {statistics.median(s):.1f} / "
                         f"{max(s):.1f} s (min / median / max of {len(s)} sessions, handshake included)")
        rows.append(t.row())
        print(t.summary(), f"[{time.monotonic() - t0:.0f} s]", t.link, file=sys.stderr, flush=True)
    print(C.Tally.header())
    print("\n".join(rows))
    for n in notes:
        print(f"\n{n}")


if __name__ == "__main__":
    main()
