"""kiln compile MODEL --target T -o DIR: compile a model to a self-contained C package (Cortex-M or
host), or with --target cuda to a CUDA package (.cu sources, launch plan, weights blob, manifest).
The backend comes from the one registry (kiln.backends): a C target is the ``c`` backend."""
from __future__ import annotations

import json
import os
import time

from kiln import hil
from kiln.backends import TARGETS, get_backend, nvrtc
from kiln.backends.manifest import FILE
from kiln.commands import add_optimize_argument
from kiln.frontend import load_model, save
from kiln.frontend.errors import KilnError
from kiln.frontend.files import staged_dir
from kiln.tflm import add_semantics_argument

PRECISIONS = ("uniform", "mixed")     # backends/tvm_te.PRECISIONS (not imported: that loads TVM)


def add_arguments(p):
    p.add_argument("model", help="model file: .tflite or Kiln graph .json")
    add_optimize_argument(p)
    p.add_argument("--target", default="cortex-m4", choices=sorted(TARGETS) + ["cuda"],
                   help="C backend target (default cortex-m4), or cuda")
    p.add_argument("--arch", default="sm_90", help="CUDA architecture for --target cuda (default sm_90)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                   help="CUDA compute dtype for --target cuda (half types accumulate in float32)")
    p.add_argument("--precision", default=None, choices=list(PRECISIONS),
                   help="storage policy of a float16/bfloat16 CUDA package: uniform (every value in the half "
                   "dtype) or mixed (matmuls and convolutions in half, the rest in float32; docs/server_targets.md "
                   "'Mixed precision'); default: uniform for inference graphs, mixed for training steps")
    p.add_argument("-o", "--out", required=True, help="output folder for the C package (written in full beside it, "
                   "then moved into place)")
    p.add_argument("--ram-budget", type=int, default=None, help="fail if the arena needs more bytes than this")
    p.add_argument("--no-plot", action="store_true", help="do not draw memory.png")
    add_semantics_argument(p)


def run(args):
    if args.target == "cuda":
        return _run_cuda(args)
    if args.precision is not None:
        raise KilnError(f"--precision {args.precision} applies to --target cuda with --dtype float16 or bfloat16; "
                        f"a C package ({args.target}) runs the model's own int8/float32 arithmetic")
    pkg = hil.compile_model(args.model, args.target, args.out, ram_budget=args.ram_budget, plot=not args.no_plot,
                            optimize=args.optimize, semantics=args.semantics)
    m = pkg.manifest
    rep = {"model": m.model, "target": m.target, "optimize": m.optimize, "package": pkg.path,
           "commands": len(m.commands), "kernels": len(m.kernels), "arena_bytes": m.arena_bytes,
           "weight_bytes": m.weight_bytes, "code_bytes": m.sizes.get("code_bytes"), "macs": m.macs,
           "planner": m.planner, "compile_seconds": m.compile_seconds,
           "semantics": m.semantics}
    lines = [f"compiled {m.model} for {m.target} (--optimize {m.optimize}) -> {pkg.path}",
             f"  commands      {rep['commands']} ({rep['kernels']} distinct kernels)",
             f"  arena         {rep['arena_bytes']:,} B (planner: {m.planner})",
             f"  weights       {rep['weight_bytes']:,} B",
             f"  code          {rep['code_bytes']:,} B (arm-none-eabi-gcc -O2 .text)" if rep["code_bytes"] is not None
             else "  code          n/a (host target)",
             f"  MACs          {rep['macs']:,}",
             *([f"  semantics     {rep['semantics']} (integer arithmetic of "
                + ("TensorFlow Lite Micro)" if rep["semantics"] == "tflm" else "LiteRT's reference kernels)")]
               if rep["semantics"] else []),
             f"  compile time  {rep['compile_seconds']:.2f} s"]
    rep["text"] = "\n".join(lines)
    return rep


def _check_precision(args, graph):
    """--precision needs a half-precision float package: refused, saying why, for a float32 one
    and for a quantised graph (whose package stores int8/int16 values)."""
    if args.precision is None:
        return
    if any(t.quant is not None for t in graph.types.values()):
        raise KilnError(f"--precision {args.precision}: {args.model} is a quantised model, whose CUDA package stores "
                        f"its int8/int16 values as they are; leave --precision out")
    if args.dtype == "float32":
        raise KilnError(f"--precision {args.precision} chooses which values a float16/bfloat16 package stores in half; "
                        f"with --dtype float32 every value is float32: add --dtype float16 or --dtype bfloat16, or "
                        f"leave --precision out")


def _run_cuda(args):
    t0 = time.time()
    graph = load_model(args.model, semantics=args.semantics)
    _check_precision(args, graph)
    with staged_dir(args.out, "package folder", last=FILE) as tmp:   # all of it or nothing
        m = get_backend("cuda").compile(graph, {"out_dir": tmp, "arch": args.arch, "dtype": args.dtype,
                                                "precision": args.precision}).manifest
        save(graph, os.path.join(tmp, "graph.json"))
    rep = {"model": graph.name, "target": "cuda", "arch": args.arch, "dtype": m.dtype, "package": args.out,
           "launches": m.launches, "kernels": len(m.kernels), "arena_bytes": m.arena_bytes,
           "weight_bytes": m.weights_bytes, "compile_seconds": round(time.time() - t0, 2), "semantics": m.semantics}
    policy = (m.extra.get("precision") or {}).get("policy")
    rep["text"] = (f"compiled {graph.name} for cuda ({args.arch}, {m.dtype}{f', {policy} precision' if policy else ''})"
                   f" -> {args.out}\n"
                   f"  {rep['launches']} launches of {rep['kernels']} kernels, arena {rep['arena_bytes']} B, weights {rep['weight_bytes']} B, "
                   f"{rep['compile_seconds']} s")
    res_file = os.path.join(args.out, "resources.json")
    if os.path.exists(res_file):   # NVRTC + ptxas -v per kernel (backends/nvrtc.py)
        with open(res_file) as f:
            rep["resources"] = json.load(f)
        rep["text"] += "\n" + nvrtc.table(rep["resources"])
    else:
        rep["resources"] = None
        rep["text"] += f"\n  not compiled with NVRTC (not installed: pip install {nvrtc.PIP})"
    return rep
