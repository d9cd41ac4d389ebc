"""kiln export MODEL -o OUT.onnx: a float model (Kiln graph .json, .pt2, .onnx or float .tflite) as
ONNX, checked with onnxruntime. ``--check N`` (default 4) runs N seeded random inputs through
onnxruntime and Kiln's reference executor and fails (exit 1) when an output differs by more than
--atol; ``--check 0`` skips it. The layout is the graph's own (docs/import.md, "Export to ONNX")."""
from __future__ import annotations

import collections
import os

from kiln.frontend import load_model
from kiln.frontend.errors import UsageError
from kiln.frontend.onnx_export import DEFAULT_OPSET, MAX_OPSET, MIN_OPSET, export_onnx


def add_arguments(p):
    p.add_argument("model", help="a float model: Kiln graph .json, .pt2, .onnx or .tflite")
    p.add_argument("-o", "--out", default=None, help="ONNX file to write (default: MODEL with the extension .onnx)")
    p.add_argument("--opset", type=int, default=DEFAULT_OPSET, choices=range(MIN_OPSET, MAX_OPSET + 1),
                   metavar="N", help=f"ONNX opset to write, {MIN_OPSET} to {MAX_OPSET} (default: {DEFAULT_OPSET})")
    p.add_argument("--check", type=int, default=4, metavar="N",
                   help="compare onnxruntime with Kiln's reference on N seeded random inputs (default: 4; 0: no check)")
    p.add_argument("--atol", type=float, default=1e-4, help="largest difference --check accepts (default: 1e-4)")
    p.add_argument("--seed", type=int, default=0, help="seed of the --check inputs")


def run(args):
    from kiln.oracles import compare, run_oracle
    from kiln.samples import random_inputs
    out = args.out or os.path.splitext(args.model)[0] + ".onnx"
    if os.path.abspath(out) == os.path.abspath(args.model):
        raise UsageError(f"-o {out} would overwrite the model itself")
    if args.check < 0:
        raise UsageError(f"--check {args.check}: give a number of inputs >= 0")
    g = load_model(args.model)
    model = export_onnx(g, out, opset=args.opset)
    ops = collections.Counter(n.op_type for n in model.graph.node)
    rep = {"model": args.model, "out": out, "opset": args.opset,
           "inputs": {i: list(g.types[i].shape) for i in g.inputs},
           "outputs": {o: list(g.types[o].shape) for o in g.outputs},
           "onnx_nodes": len(model.graph.node), "onnx_ops": dict(sorted(ops.items())),
           "transposes": ops.get("Transpose", 0), "bytes": os.path.getsize(out)}
    lines = [f"exported {args.model} -> {out} (ONNX opset {args.opset}, {rep['bytes']:,} B)",
             "  inputs      " + ", ".join(f"{k} {v}" for k, v in rep["inputs"].items()),
             "  outputs     " + ", ".join(f"{k} {v}" for k, v in rep["outputs"].items()),
             f"  nodes       {rep['onnx_nodes']} ({', '.join(f'{k} {v}' for k, v in rep['onnx_ops'].items())})"]
    if args.check:
        samples = random_inputs(g, args.check, args.seed)
        diffs = compare(g, run_oracle(out, g, samples), samples)
        rep["check"] = {"oracle": "onnxruntime", "inputs": args.check, "max_abs_diff": diffs,
                        "atol": args.atol, "ok": all(d <= args.atol for d in diffs)}
        rep["ok"] = rep["check"]["ok"]
        lines.append(f"  check       onnxruntime on {args.check} random inputs: max |diff| "
                     + ", ".join(f"{d:.3g}" for d in diffs) + f" ({'OK' if rep['ok'] else 'FAILED'}, atol {args.atol})")
    rep["text"] = "\n".join(lines)
    return rep
