"""Quantisation benchmark: int8 accuracy of the digits CNN (PTQ methods, per-tensor, QAT) against
float, bit-exactness of exported models in LiteRT, and the int8 reference on the shared models.

Prints the "## Quantisation" section of docs/benchmarks.md (or --json); --write replaces it there
(other sections are left alone). The shared-model rows need --shared DIR (or $KILN_SHARED).

    .venv/bin/python benchmarks/quant_bench.py --shared DIR --write   # seeds 0,1,2; updates docs/benchmarks.md
    .venv/bin/python benchmarks/quant_bench.py --seeds 0 --json

Targets: int8 within 1.0 pp of float with PTQ, within 0.3 pp with QAT.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

from kiln.docs_util import (
    add_shared_argument,
    add_write_argument,
    script_main,
    shared_models,
    write_path,
    write_section,
)
from kiln.errors import UsageError

PTQ_TARGET_PP, QAT_TARGET_PP = 1.0, 0.3


def litert_mismatches(q, data, xs):
    """How many samples' LiteRT (BUILTIN_REF) outputs differ from Kiln's int8 reference."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    from kiln.frontend import run
    it = Interpreter(model_content=data, experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    it.allocate_tensors()
    i, o = it.get_input_details()[0]["index"], it.get_output_details()[0]["index"]
    bad = 0
    for x in xs:
        it.set_tensor(i, x[None])
        it.invoke()
        bad += not np.array_equal(it.get_tensor(o), run(q, x[None])[0])
    return bad


def digits_rows(seed, qat_epochs):
    from kiln.commands.quantize import accuracy
    from kiln.quantize import export_tflite, ptq, qat
    from kiln.training import digits, train_digits
    train, test = digits()
    t = time.time()
    r = train_digits(seed=seed)
    train_s = time.time() - t
    g = r.graph
    fa = accuracy(g, test.x, test.y)
    calib = train.x[:500]
    rows = []
    for name, kw in [("PTQ minmax, per-channel", dict(method="minmax")),
                     ("PTQ percentile, per-channel", dict(method="percentile")),
                     ("PTQ mse, per-channel", dict(method="mse")),
                     ("PTQ minmax, per-tensor", dict(method="minmax", per_channel=False)),
                     ("PTQ minmax, per-channel, int8 I/O", dict(method="minmax", int8_io=True))]:
        t = time.time()
        q = ptq(g, calib, **kw)
        s = time.time() - t
        qa = accuracy(q, test.x, test.y)
        row = dict(seed=seed, mode=name, float=fa, int8=qa, delta_pp=100 * (qa - fa), seconds=s,
                   target_pp=PTQ_TARGET_PP)
        if name.endswith("per-channel"):
            row["litert_mismatch"] = litert_mismatches(q, export_tflite(q), test.x.astype(np.float32))
        rows.append(row)
    t = time.time()
    res = qat(g, train, test, epochs=qat_epochs, lr=1e-4, calibration=calib)
    s = time.time() - t
    qa = accuracy(res.graph, test.x, test.y)
    rows.append(dict(seed=seed, mode=f"QAT {qat_epochs} epochs, per-channel", float=fa, int8=qa,
                     delta_pp=100 * (qa - fa), seconds=s, target_pp=QAT_TARGET_PP,
                     litert_mismatch=litert_mismatches(res.graph, export_tflite(res.graph), test.x.astype(np.float32))))
    return rows, train_s, len(test.x)


def shared_rows(paths):
    from kiln.commands.inspect import summarize
    from kiln.frontend import run
    from kiln.frontend.tflite_import import load_tflite
    rows = []
    for path in paths:
        m = os.path.basename(path)[:-len(".tflite")]
        g = load_tflite(path)
        z = np.load(path[:-len(".tflite")] + ".golden.npz")
        ok = 0
        t = time.perf_counter()
        for k in range(8):
            ok += np.array_equal(run(g, z[f"in_{k}"])[0], z[f"out_{k}"])
        ms = (time.perf_counter() - t) / 8 * 1e3
        s = summarize(g)
        rows.append(dict(model=m, golden=f"{ok}/8", ms=ms, macs=s["macs"], weight_bytes=s["weight_bytes"],
                         peak=s["peak_activation_bytes"]))
    return rows


def markdown(digits, shared, meta):
    L = ["## Quantisation", "",
         f"`benchmarks/quant_bench.py` on {meta['machine']} ({meta['date']}). The digits CNN (zoo `digits-cnn`, "
         f"the demo recipe, {meta['test']} test images) is trained per seed, then quantised with "
         "500 calibration images. Targets: PTQ within "
         f"{PTQ_TARGET_PP} pp of float, QAT within {QAT_TARGET_PP} pp. 'LiteRT mismatches' counts test images "
         "whose output from the exported .tflite under LiteRT's reference kernels differs from Kiln's int8 "
         "reference (by any bit).", "",
         "| seed | mode | float acc | int8 acc | delta (pp) | target | LiteRT mismatches | seconds |",
         "|---|---|---|---|---|---|---|---|"]
    for r in digits:
        ok = "met" if abs(r["delta_pp"]) <= r["target_pp"] + 1e-9 or r["delta_pp"] > 0 else "MISSED"
        L.append(f"| {r['seed']} | {r['mode']} | {100 * r['float']:.2f}% | {100 * r['int8']:.2f}% | "
                 f"{r['delta_pp']:+.2f} | {ok} (<= {r['target_pp']}) | "
                 f"{r.get('litert_mismatch', '-') if 'litert_mismatch' in r else '-'} | {r['seconds']:.2f} |")
    L += ["", "Shared MLPerf Tiny models, imported from .tflite and run by the NumPy int8 reference "
          "(`--target reference`):", "",
          "| model | golden pairs bit-exact | ms / inference | MACs | weight bytes | peak activation bytes |",
          "|---|---|---|---|---|---|"]
    for r in shared:
        L.append(f"| {r['model']} | {r['golden']} | {r['ms']:.1f} | {r['macs']:,} | {r['weight_bytes']:,} | "
                 f"{r['peak']:,} |")
    L += ["", "Per-tensor dense layers export as FULLY_CONNECTED, which LiteRT's reference kernel requantises in "
          "double precision (see docs/int8_ir.md); per-channel ones export as 1x1 convolutions and match "
          "bit for bit.", ""]
    return "\n".join(L)




def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2", help="comma-separated training seeds of the digits CNN (default: 0,1,2)")
    p.add_argument("--qat-epochs", type=int, default=3, help="QAT fine-tuning epochs (default: 3)")
    add_shared_argument(p)
    add_write_argument(p, "## Quantisation")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of the table")
    a = p.parse_args(argv)
    md_path = write_path(a.write)
    names = ["kws_ref_model.tflite", "pretrainedResnet_quant.tflite"]
    if a.shared or os.environ.get("KILN_SHARED"):
        paths = shared_models(a.shared, names)
    else:
        if md_path:
            raise UsageError("--write needs the shared-model rows too: pass --shared DIR (or set KILN_SHARED)")
        paths = []
        print("quant_bench: no --shared DIR (or KILN_SHARED): skipping the shared-model rows", file=sys.stderr)
    digits, train_s, ntest = [], [], 0
    for s in (int(v) for v in a.seeds.split(",")):
        rows, ts, ntest = digits_rows(s, a.qat_epochs)
        digits += rows
        train_s.append(ts)
    shared = shared_rows(paths)
    meta = {"machine": f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}",
            "date": time.strftime("%Y-%m-%d"), "test": ntest, "train_seconds": train_s}
    text = markdown(digits, shared, meta)
    if md_path:
        write_section(md_path, text)
    if a.json:
        print(json.dumps({"digits": digits, "shared": shared, "meta": meta}))
    else:
        print(text)
    missed = [r for r in digits if r["delta_pp"] < -r["target_pp"] - 1e-9 and "int8 I/O" not in r["mode"]
              and "per-tensor" not in r["mode"]]
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(script_main(main))
