"""Half-precision training steps of the model zoo against float64, per storage policy.

For each zoo model, its training step at batch 64 (benchmarks/cuda_sim_zoo.py's "train" case) is
compiled as a CUDA package for each half dtype under each storage policy (backends/tvm_te.py
PRECISIONS: "uniform", every value in the half dtype; "mixed", automatic mixed precision with
loss scaling) and run on the CPU by the plan interpreter (cuda-plan: the package's step functions
on its own arena and weights blob, in their storage dtypes). Outputs are compared with the same
step computed in float64 (cuda_sim.errors64: gradients relative to the step's largest gradient),
each within its bound (cuda_sim.bounds64: TOLERANCE64 of the dtype, or 4x NumPy's float32 error
where larger, or 4x the rounding floor of the inputs and parameters alone, values=False: the policy
compared against the same allowance for both; `kiln verify --float64` also rounds the stored
values). BatchNorm buffer updates are not compared (the interpreter returns outputs only).
Prints one JSON object; --markdown also writes the table.

    .venv/bin/python benchmarks/cuda_mixed_precision.py [--models ds-cnn,resnet8] \\
        [--dtypes float16,bfloat16] [--precisions uniform,mixed] [--markdown table.md]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time


def run_case(graph, inputs, want, peer, dtype, precision, workdir):
    """One package: {max_err, worst, bound, ok, arena_bytes, ...} against the float64 ``want``."""
    from kiln.backends import cuda, cuda_plan, cuda_sim
    t0 = time.perf_counter()
    pkg = cuda.compile_train_step(graph, os.path.join(workdir, f"{graph.name}-{dtype}-{precision}"), dtype=dtype,
                                  check=False, precision=precision)
    t1 = time.perf_counter()
    got = cuda_plan.interpret_plan(pkg, inputs)
    m = cuda.load_manifest(pkg)
    errs = cuda_sim.errors64(graph, got, want)
    p = m.extra.get("precision", {})
    floor = cuda_sim.rounding_floor64(graph, inputs, want, None, dtype, storage=p.get("storage"), values=False)
    bound = cuda_sim.bounds_from(dtype, peer, floor)
    worst = max(errs, key=lambda k: errs[k] / bound[k])
    return {"dtype": dtype, "precision": precision, "loss_scale": p.get("loss_scale"), "max_err": max(errs.values()),
            "worst": worst, "worst_err": errs[worst], "bound": bound[worst], "floor": max(floor.values()),
            "ok": all(errs[k] <= bound[k] for k in errs), "arena_bytes": m.arena_bytes,
            "weights_bytes": m.weights_bytes, "compile_s": round(t1 - t0, 1),
            "run_s": round(time.perf_counter() - t1, 1)}


def markdown(rows):
    lines = ["| model | dtype | policy | max error vs float64 | output nearest its bound: error / bound | ok | "
             "arena bytes |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['dtype']} | {r['precision']} | {r['max_err']:.2e} | {r['worst']}: "
                     f"{r['worst_err']:.2e} / {r['bound']:.0e} | {'yes' if r['ok'] else 'NO'} | {r['arena_bytes']:,} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    from benchmarks.cuda_sim_zoo import MODELS, zoo_case
    from kiln.backends import cuda_sim
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--dtypes", default="float16,bfloat16")
    p.add_argument("--precisions", default="uniform,mixed")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--markdown", metavar="PATH", help="also write the table to this file")
    a = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="kiln-amp-") as work:
        for model in a.models.split(","):
            graph, inputs = zoo_case(model, a.batch, True)
            want, _ = cuda_sim.reference64(graph, inputs)
            _, peer, _ = cuda_sim.bounds64(graph, inputs, want, None, "float32")
            for dtype in a.dtypes.split(","):
                for precision in a.precisions.split(","):
                    rows.append(dict(model=model, **run_case(graph, inputs, want, peer, dtype, precision, work)))
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(json.dumps({"ok": all(r["ok"] for r in rows), "results": rows}))
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(markdown(rows))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
