"""The model zoo's CUDA packages run on the CPU by cuda-sim, checked against float64.

For each zoo model: inference at batch 1 and batch 64 (eval mode) and the training step at batch
64 (forward + loss + backward, train-mode BatchNorm with its buffer updates, dropout masks from a
fixed key) are compiled as CUDA packages (float32 by default, --dtypes for float16/bfloat16;
DLight schedules, no NVRTC check) and run by
backends/cuda_sim.py on pocl with the packages' own launch plans, on a NaN-poisoned arena between
guard zones. Every output, gradient and buffer update is compared with the same graph run by the
NumPy executor in float64 (cuda_sim.check64: error relative to the output's scale, gradients to
the step's largest gradient). An output whose rounding floor is beyond what float64 can judge
(cuda_sim.beyond_float64: mobilenet-v1-0.25's half training steps) also needs the package to pass
launch by launch (cuda_sim.stepwise, run automatically; progress per step on stderr). Prints one
JSON object; --markdown also writes the table.

    .venv/bin/python benchmarks/cuda_sim_zoo.py [--models ds-cnn,resnet8] [--cases b1,b64,train] \\
        [--dtypes float32,float16,bfloat16] [--markdown table.md]

Exit status 1 when a case is over its tolerance or a guard zone was written.

--conditioning compiles and runs nothing: for each model's batch-64 training step and each half
dtype it prints the rounding floor (cuda_sim.rounding_floor64, with the mixed-precision storage
map) twice: as the check computes it, and with every boolean value of the step (the ReLU/ReLU6
masks of the backward pass, comparisons) held at its exact float64 value (frozen_branches). A
floor that collapses when the branches are held comes from inputs crossing a kink, not from a
smooth amplification.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

MODELS = ("digits-cnn", "fc-autoencoder", "ds-cnn", "resnet8", "mobilenet-v1-0.25")
CASES = {"b1": (1, False), "b64": (64, False), "train": (64, True)}


def zoo_case(name, batch, train, seed=0):
    """(graph, inputs) of zoo model ``name``: its inference graph at ``batch`` in eval mode, or
    its training step at ``batch``, with random inputs (kiln.training.cases.case)."""
    from kiln.cases import case
    return case(name, batch, train, seed)


def frozen_branches(graph, values):
    """A copy of ``graph`` in which every node with a boolean result (the ReLU/ReLU6 masks of a
    training step's backward pass, comparisons) is replaced by the constant ``values[name]``: the
    step on the branches that ``values`` took, smooth in its inputs and parameters."""
    g = graph.copy()
    held = {n.name for n in g.nodes if g.types[n.name].dtype == "bool"}
    g.nodes = [n for n in g.nodes if n.name not in held]
    for k in held:
        g.consts[k] = np.asarray(values[k], bool)
    return g


def conditioning(name, dtype, batch=64):
    """{"floor", "worst", "floor_fixed_branches", "worst_fixed", "branches"} of zoo model
    ``name``'s training step: its largest rounding floor in ``dtype`` (mixed-precision storage),
    the same with the step's boolean values held at the exact float64 step's (frozen_branches),
    the outputs where each is largest and how many boolean values were held."""
    from kiln.backends import cuda_sim, tvm_te
    from kiln.frontend import executor
    graph, inputs = zoo_case(name, batch, True)
    held = [n.name for n in graph.nodes if graph.types[n.name].dtype == "bool"]
    want, kept = executor.run(cuda_sim.float64_graph(graph), *[np.asarray(x, np.float64) if x.dtype == np.float32
                                                               else x for x in inputs], keep=held)
    storage = tvm_te.precision_plan(graph, dtype, "mixed").storage
    r = {"model": name, "dtype": dtype, "branches": len(held)}
    for key, g in (("", graph), ("_fixed_branches", frozen_branches(graph, kept))):
        floor = cuda_sim.rounding_floor64(g, inputs, want, None, dtype, storage=storage, values=False)
        worst = max(floor, key=floor.get)
        r["floor" + key], r["worst" + ("_fixed" if key else "")] = float(f"{floor[worst]:.3g}"), worst
    return r


def run_case(name, case, workdir, dtype="float32", batch=None, check=False, stepwise=False):
    """Compile one zoo case for CUDA (``check``: the NVRTC/ptxas check of cuda.compile), run it on
    cuda-sim, compare with float64: one result dict. ``batch`` overrides the case's. ``stepwise``:
    check it launch by launch instead (cuda_sim.stepwise, no float64 reference)."""
    from kiln.backends import cuda, cuda_sim
    batch, train = batch or CASES[case][0], CASES[case][1]
    graph, inputs = zoo_case(name, batch, train)
    out = os.path.join(workdir, f"{name}-{case}-{dtype}")
    t0 = time.perf_counter()
    pkg = (cuda.compile_train_step if train else cuda.compile)(graph, out, dtype=dtype, check=check)
    t1 = time.perf_counter()
    if stepwise:
        return stepwise_row(pkg, inputs, dict(model=name, case=case, batch=batch, dtype=dtype,
                                              compile_s=round(t1 - t0, 1)), t1)
    try:
        r = cuda_sim.check64(pkg, graph, inputs, progress=_progress)
    except cuda_sim.GuardViolation as e:
        r = {"max_err": None, "worst": None, "errors": {}, "float32_errors": {}, "bound": None, "beyond_float64": [],
             "stepwise": None, "tolerance": cuda_sim.TOLERANCE64[dtype], "ok": False, "guards_clean": False,
             "error": str(e)}
    r.update(model=name, case=case, batch=batch, dtype=dtype, launches=sum(len(s.launches) for s in
                                                                            cuda.load_manifest(pkg).steps),
             compile_s=round(t1 - t0, 1), sim_s=round(time.perf_counter() - t1, 1))
    r["max_float32_err"] = max(r["float32_errors"].values(), default=None)
    for k in ("errors", "float32_errors"):
        r[k] = {n: float(f"{v:.3g}") for n, v in r[k].items()}
    return r


def _progress(step):
    print(json.dumps(dict(step, kernels=len(step["kernels"]))), file=sys.stderr, flush=True)


def stepwise_row(pkg, inputs, row, t1):
    """One result dict of cuda_sim.stepwise on ``pkg`` (``row``: the case's fields)."""
    from kiln.backends import cuda_sim
    try:
        r = cuda_sim.stepwise(pkg, inputs, progress=_progress)
    except cuda_sim.GuardViolation as e:
        r = {"ok": False, "error": str(e), "per_step": []}
    r.update(row, sim_s=round(time.perf_counter() - t1, 1), guards_clean="error" not in r)
    r["per_step"] = [dict(s, err=None if s["err"] is None else float(f"{s['err']:.3g}")) for s in r["per_step"]]
    return r


def markdown(rows):
    lines = ["| model | case | launches | cuda-sim max error vs float64 | NumPy float32 max error vs float64 | "
             "output nearest its bound: error / bound | launch by launch | guard zones |",
             "|---|---|---|---|---|---|---|---|"]

    def e(v):
        return "-" if v is None else f"{v:.1e}"
    for r in rows:
        near = "-" if r["worst"] is None else f"{r['worst']}: {e(r['errors'][r['worst']])} / {e(r['bound'])}"
        sw = r.get("stepwise")
        launches = "-" if not sw else (f"{sw['checked']} / {sw['steps']} steps pass" if sw["ok"] else
                                       f"FAILS at step {sw['failing_step']}")
        lines.append(f"| {r['model']} | {r['case']} ({r['dtype']}) | {r['launches']} | {e(r['max_err'])} | "
                     f"{e(r['max_float32_err'])} | {near} | {launches} | {'clean' if r['guards_clean'] else 'WRITTEN'} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated zoo models (default: {','.join(MODELS)})")
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated cases: b1, b64, train (default: all)")
    p.add_argument("--dtypes", default="float32", help="comma-separated storage dtypes: float32, float16, bfloat16 "
                   "(default: float32)")
    p.add_argument("--markdown", metavar="PATH", help="also write the table to this file")
    p.add_argument("--conditioning", action="store_true", help="only measure each training step's rounding floor "
                   "with and without its ReLU masks held (no package is built)")
    p.add_argument("--stepwise", action="store_true", help="check each package launch by launch against its "
                   "unscheduled step functions (cuda_sim.stepwise) instead of against float64")
    a = p.parse_args(argv)
    if a.conditioning:
        rows = [conditioning(m.strip(), dt.strip()) for m in a.models.split(",") for dt in a.dtypes.split(",")]
        print(json.dumps({"conditioning": rows}))
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="kiln-cuda-sim-zoo-") as work:
        for m in a.models.split(","):
            for c in a.cases.split(","):
                for dt in a.dtypes.split(","):
                    rows.append(run_case(m.strip(), c.strip(), work, dtype=dt.strip(), stepwise=a.stepwise))
                    print(json.dumps({k: v for k, v in rows[-1].items()
                                      if k not in ("errors", "float32_errors", "per_step")}),
                          file=sys.stderr, flush=True)
    print(json.dumps({"ok": all(r["ok"] and r["guards_clean"] for r in rows), "results": rows}))
    if a.markdown and not a.stepwise:
        with open(a.markdown, "w") as f:
            f.write(markdown(rows))
    return 0 if all(r["ok"] and r["guards_clean"] for r in rows) else 1


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
