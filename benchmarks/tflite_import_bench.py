"""Import every .tflite in a folder and compare Kiln's reference with LiteRT's reference kernels
(BUILTIN_REF) on seeded random inputs (standard normal floats, uniform int8).

int8 outputs must be identical. Float outputs report the largest absolute difference. For a
dynamic-range ("hybrid") model, whose int8 weights Kiln dequantises at import, the script also
reports the relative RMS difference from LiteRT's hybrid kernels (which quantise activations on the
fly) and the largest difference from LiteRT's float kernels running Kiln's export of the imported
float graph (the same computation as Kiln's: it must stay at float32 rounding level).

    .venv/bin/python benchmarks/tflite_import_bench.py /path/to/models [--inputs 100]
"""
from __future__ import annotations

import argparse
import glob
import os

import numpy as np

from kiln.frontend import KilnError, run
from kiln.frontend.tflite_import import load_tflite
from kiln.quantize.tflite_export import export_tflite


def _litert(model, inputs):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType
    kw = {"model_content": model} if isinstance(model, bytes) else {"model_path": model}
    it = Interpreter(experimental_op_resolver_type=OpResolverType.BUILTIN_REF, **kw)
    it.allocate_tensors()
    outs = []
    for xs in inputs:
        for d, x in zip(it.get_input_details(), xs):
            it.set_tensor(d["index"], x)
        it.invoke()
        outs.append([it.get_tensor(d["index"]).copy() for d in it.get_output_details()])
    return outs


def _inputs(g, n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        xs = []
        for name in g.inputs:
            t = g.types[name]
            if t.dtype == "int8":
                xs.append(rng.integers(-128, 128, t.shape).astype(np.int8))
            else:
                xs.append(rng.standard_normal(t.shape).astype(np.float32))
        out.append(xs)
    return out


def measure(path, n):
    g = load_tflite(path)
    ins = _inputs(g, n)
    kiln = [run(g, *xs) for xs in ins]
    lit = _litert(path, ins)
    row = {"model": os.path.basename(path), "hybrid weights": len(g.meta.get("dequantized_weights", []))}
    k = [np.stack([o[j] for o in kiln]) for j in range(len(g.outputs))]
    L = [np.stack([o[j] for o in lit]) for j in range(len(g.outputs))]
    if all(a.dtype.kind in "iu" for a in L):
        row["int outputs differing"] = int(sum(np.sum(a != b) for a, b in zip(k, L)))
        row["of"] = int(sum(a.size for a in L))
        return row
    row["max |Kiln - LiteRT|"] = max(float(np.abs(a.astype(np.float64) - b).max()) for a, b in zip(k, L))
    row["max |LiteRT|"] = max(float(np.abs(b).max()) for b in L)
    if row["hybrid weights"]:
        row["rel RMS vs hybrid kernels"] = max(float(np.sqrt(np.mean((a - b) ** 2)) / np.sqrt(np.mean(b ** 2)))
                                               for a, b in zip(k, L))
        f = _litert(export_tflite(g), ins)
        row["max |Kiln - LiteRT float on dequantised weights|"] = max(
            float(np.abs(np.stack([o[j] for o in f]) - k[j]).max()) for j in range(len(g.outputs)))
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--inputs", type=int, default=100)
    a = ap.parse_args(argv)
    for path in sorted(glob.glob(os.path.join(a.folder, "*.tflite"))):
        try:
            row = measure(path, a.inputs)
        except KilnError as e:
            row = {"model": os.path.basename(path), "import": f"FAILED: {e}"}
        print(" | ".join(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}" for k, v in row.items()))


if __name__ == "__main__":
    main()
