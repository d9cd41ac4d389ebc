"""kiln import MODEL -o OUT.json: a PyTorch ExportedProgram (.pt2, torch.export.save) or an ONNX
model (.onnx) as a Kiln graph (JSON + .npz). ``--check N`` runs N seeded random inputs through the
source framework (torch / onnxruntime) and Kiln's reference executor and fails (exit 1) when an
output differs by more than --atol. Every command that takes a MODEL also reads .pt2 and .onnx
directly; importing once saves the conversion and gives a graph to fine-tune (`kiln train
--model OUT.json`)."""
from __future__ import annotations

import collections
import os

from kiln.frontend import load_model, save
from kiln.frontend.errors import UsageError


def add_arguments(p):
    p.add_argument("model", help="a .pt2 (torch.export.save) or .onnx model (a .tflite works too)")
    p.add_argument("-o", "--out", default=None, help="Kiln graph to write (.json, tensors in the .npz beside it; "
                   "default: MODEL with the extension .json)")
    p.add_argument("--check", type=int, default=0, metavar="N",
                   help="compare with the source framework on N seeded random inputs (default: 0, no check)")
    p.add_argument("--atol", type=float, default=1e-4, help="largest difference --check accepts (default: 1e-4)")
    p.add_argument("--seed", type=int, default=0, help="seed of the --check inputs")


def run(args):
    from kiln.oracles import compare, oracle_name, run_oracle
    from kiln.samples import random_inputs
    out = args.out or os.path.splitext(args.model)[0] + ".json"
    if os.path.abspath(out) == os.path.abspath(args.model):
        raise UsageError(f"-o {out} would overwrite the model itself")
    g = load_model(args.model)
    save(g, out)
    ops = collections.Counter(n.op for n in g.nodes)
    rep = {"model": args.model, "out": out, "source": g.meta.get("source", os.path.splitext(args.model)[1][1:]),
           "inputs": {i: list(g.types[i].shape) for i in g.inputs},
           "outputs": {o: list(g.types[o].shape) for o in g.outputs}, "nodes": len(g.nodes),
           "parameters": int(sum(v.size for v in g.params.values())), "ops": dict(sorted(ops.items())),
           "transposes": ops.get("transpose", 0)}
    lines = [f"imported {args.model} ({rep['source']}) -> {out}",
             "  inputs      " + ", ".join(f"{k} {v}" for k, v in rep["inputs"].items()),
             "  outputs     " + ", ".join(f"{k} {v}" for k, v in rep["outputs"].items()),
             f"  nodes       {rep['nodes']} ({', '.join(f'{k} {v}' for k, v in rep['ops'].items())})",
             f"  parameters  {rep['parameters']:,} in {len(g.params)} tensors"]
    if args.check:
        if oracle_name(args.model) is None:
            raise UsageError(f"--check compares with the source framework: {args.model} is not a .pt2 or .onnx")
        samples = random_inputs(g, args.check, args.seed)
        diffs = compare(g, run_oracle(args.model, g, samples), samples)
        rep["check"] = {"oracle": oracle_name(args.model), "inputs": args.check, "max_abs_diff": diffs,
                        "atol": args.atol, "ok": all(d <= args.atol for d in diffs)}
        rep["ok"] = rep["check"]["ok"]
        lines.append(f"  check       {rep['check']['oracle']} on {args.check} random inputs: max |diff| "
                     + ", ".join(f"{d:.3g}" for d in diffs) + f" ({'OK' if rep['ok'] else 'FAILED'}, atol {args.atol})")
    rep["text"] = "\n".join(lines)
    return rep
