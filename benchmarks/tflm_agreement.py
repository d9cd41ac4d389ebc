"""Kiln's reference against TensorFlow Lite Micro's interpreter on every .tflite under the given
folders: two random samples each (``kiln.samples.random_inputs``, seed 0: integer inputs over their
whole range, int32 ones from [-1000, 1000]), outputs compared bit for
bit (float outputs within 1e-4 of their scale). For each model that differs, the first differing
operator is named (the model cut after each operator, exported and run on both).

    .venv/bin/python benchmarks/tflm_agreement.py FOLDER... [--semantics tflm] [--markdown table.md] [--json]

Needs the tflite-micro pip package (kiln/tflm.py)."""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile

import numpy as np

from kiln import tflm
from kiln.frontend import load_model, run
from kiln.quantize.tflite_export import export_tflite
from kiln.samples import random_inputs

# int32 inputs (indices, counts) from [-1000, 1000]; other integer inputs over their whole range
INT32_RANGE = {"int32": (-1000, 1000)}


def same(a, b):
    a, b = np.asarray(a).reshape(-1), np.asarray(b).reshape(-1)
    if a.dtype.kind == "f":
        return np.allclose(a, b.astype(np.float64), rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(b).max(initial=0))))
    return np.array_equal(a.astype(np.int64), b.astype(np.int64))


def first_differing_node(path, samples_, semantics="litert"):
    """(index, op) of the first operator whose output differs from TFLite Micro's on any of the
    samples, or None."""
    g0 = load_model(path, semantics=semantics)
    for k, n in enumerate(g0.nodes):
        if g0.types[n.name].dtype not in ("int8", "int16"):
            continue
        g = g0.copy()
        g.nodes, g.outputs = g.nodes[:k + 1], [n.name]
        try:
            data = export_tflite(g)
        except Exception:       # noqa: BLE001 (a cut that does not export: skip it)
            continue
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "cut.tflite")
            with open(p, "wb") as f:
                f.write(data)
            try:
                wants = tflm.run_tflm(p, [xs[:len(g.inputs)] for xs in samples_])
            except tflm.TflmError:
                continue
        if not all(same(run(g, *xs[:len(g.inputs)])[0], w[0]) for xs, w in zip(samples_, wants)):
            return k, n.op
    return None


def check(path, semantics="litert"):
    try:
        g = load_model(path, semantics=semantics)
    except Exception as e:      # noqa: BLE001 (reported per model)
        return {"model": path, "result": "kiln cannot import", "why": str(e).splitlines()[0][:160]}
    if g.states:
        return {"model": path, "result": "skipped (stateful)"}
    xs = random_inputs(g, 2, seed=0, int_ranges=INT32_RANGE)
    try:
        want = tflm.run_tflm(path, xs)
    except tflm.TflmError as e:
        return {"model": path, "result": "tflm cannot run", "why": str(e)[:160]}
    got = [tuple(run(g, *x)) for x in xs]
    if all(same(a, b) for gs, ws in zip(got, want) for a, b in zip(gs, ws)):
        return {"model": path, "result": "same"}
    where = first_differing_node(path, xs, semantics)
    return {"model": path, "result": "differs", "first_node": where}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+")
    ap.add_argument("--markdown")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--semantics", default="litert", choices=["litert", "tflm"],
                    help="the semantics each model is loaded with (load_model; docs/int8_ir.md)")
    a = ap.parse_args(argv)
    if not tflm.available():
        print("tflite-micro is not installed", file=sys.stderr)
        return 2
    paths = sorted({p for r in a.folders for p in glob.glob(os.path.join(r, "**", "*.tflite"), recursive=True)})
    rows = []
    for k, p in enumerate(paths):
        rows.append(check(p, a.semantics))
        print(f"[{k + 1}/{len(paths)}] {rows[-1]['result']}: {p}", file=sys.stderr, flush=True)
    counts = {}
    for r in rows:
        counts[r["result"]] = counts.get(r["result"], 0) + 1
    report = {"models": len(rows), "counts": counts, "rows": [r for r in rows if r["result"] != "same"]}
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write("| model | result | first differing operator / why |\n|---|---|---|\n")
            for r in report["rows"]:
                fn = r.get("first_node")
                f.write(f"| {os.path.basename(r['model'])} | {r['result']} | "
                        f"{(f'{fn[1]} (operator {fn[0]})' if fn else r.get('why', ''))} |\n")
    print(json.dumps(report) if a.json else json.dumps(counts))
    return 1 if counts.get("differs") else 0


if __name__ == "__main__":
    sys.exit(main())
