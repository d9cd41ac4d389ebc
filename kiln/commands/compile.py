"""kiln compile MODEL --target T -o DIR: compile a model to a self-contained C package."""
from __future__ import annotations

from kiln.backends.cpus import TARGETS


def add_arguments(p):
    p.add_argument("model", help="model file: .tflite or Kiln graph .json")
    p.add_argument("--target", default="cortex-m4", choices=sorted(TARGETS),
                   help="C backend target (default cortex-m4)")
    p.add_argument("-o", "--out", required=True, help="output folder for the C package")
    p.add_argument("--ram-budget", type=int, default=None, help="fail if the arena needs more bytes than this")
    p.add_argument("--no-plot", action="store_true", help="do not draw memory.png")


def run(args):
    from kiln.backends import compile as compile_pkg
    pkg = compile_pkg(args.model, target=args.target, out_dir=args.out, ram_budget=args.ram_budget,
                      plot=not args.no_plot)
    m = pkg.manifest
    sizes = m.get("sizes") or {}
    rep = {"model": m["model"], "target": m["target"], "package": pkg.path, "commands": len(m["commands"]),
           "kernels": len(m["kernels"]), "arena_bytes": m["arena_bytes"], "weight_bytes": m["weight_bytes"],
           "code_bytes": sizes.get("code_bytes"), "macs": m["macs"], "planner": m["planner"],
           "compile_seconds": m["compile_seconds"]}
    lines = [f"compiled {m['model']} for {m['target']} -> {pkg.path}",
             f"  commands      {rep['commands']} ({rep['kernels']} distinct kernels)",
             f"  arena         {rep['arena_bytes']:,} B (planner: {m['planner']})",
             f"  weights       {rep['weight_bytes']:,} B",
             f"  code          {rep['code_bytes']:,} B (arm-none-eabi-gcc -O2 .text)" if rep["code_bytes"] is not None
             else "  code          n/a (host target)",
             f"  MACs          {rep['macs']:,}",
             f"  compile time  {rep['compile_seconds']:.2f} s"]
    rep["text"] = "\n".join(lines)
    return rep
