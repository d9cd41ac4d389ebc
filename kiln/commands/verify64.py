"""kiln verify MODEL --target cuda-sim --float64: a float model, or its training step, compiled as a
CUDA package, run on cuda-sim and compared with the same graph computed in float64.

Each output (and gradient, and BatchNorm buffer update) is held to its own bound
(backends/cuda_sim.py, TOLERANCE64: the storage dtype's tolerance, 4x what NumPy's float32 run
misses, 4x the half-precision rounding floor); an output whose floor is beyond what float64 can
judge also needs the package to pass launch by launch (cuda_sim.beyond_float64, cuda_sim.stepwise).
"""
from __future__ import annotations

import os
import sys
import time

from kiln.backends import cuda, cuda_int8, cuda_sim, is_package
from kiln.cases import case
from kiln.commands import BuildFolder
from kiln.errors import UsageError

PROGRESS_EVERY = 50


def _progress(row):
    if row["step"] % PROGRESS_EVERY == 0 or not row["ok"]:
        print(f"launch by launch: step {row['step']} ({row['func']}) {'ok' if row['ok'] else 'FAILS'}",
              file=sys.stderr, flush=True)


def verify64(model, target="cuda-sim", dtype="float32", train=False, batch=None, seed=0, out=None, keep=False):
    """The report of ``kiln verify --float64`` (see the module docstring): ``model`` a zoo name, a
    .py model file or a float model file; ``batch`` default 1 (inference) or 64 (training step)."""
    if target != "cuda-sim":
        raise UsageError(f"--float64 checks a CUDA package on cuda-sim against float64: use --target cuda-sim "
                         f"(not {target!r}); other targets compare with --golden pairs")
    if is_package(os.fspath(model)):
        raise UsageError(f"{model} is a compiled package: --float64 needs the model it came from (a zoo name or a "
                         f"float model file), to compute it in float64")
    graph, inputs = case(model, batch, train, seed)
    batch = int(inputs[0].shape[0]) if inputs and inputs[0].ndim else batch
    if cuda_int8.is_quantised(graph):
        raise UsageError(f"{model} is quantised: its CUDA package is checked bit for bit against golden pairs "
                         f"(kiln golden, then kiln verify --golden G.npz --target cuda-sim), not against float64")
    t0 = time.time()
    with BuildFolder(out, keep, "kiln_verify64_") as build:
        path = os.path.join(build.path, "cuda_package")
        pkg = (cuda.compile_train_step if train else cuda.compile)(graph, path, dtype=dtype, check=False)
        try:
            r = cuda_sim.check64(pkg, graph, inputs, progress=_progress)
        except cuda_sim.GuardViolation as e:
            r = {"ok": False, "guards_clean": False, "error": str(e)}
    return _report(r, graph, model, target, dtype, train, batch, seed, build.kept, time.time() - t0)


def _report(r, graph, model, target, dtype, train, batch, seed, kept, seconds):
    rep = {"ok": bool(r["ok"]), "model": str(model), "target": target, "dtype": dtype,
           "case": "training step" if train else "inference", "batch": batch, "seed": seed,
           "comparison": "float64: each output within its bound (the dtype's tolerance, 4x NumPy float32's error, "
                         "4x the half-precision rounding floor; beyond float64: launch by launch too)",
           "guards_clean": r["guards_clean"], "seconds": round(seconds, 1), "build": kept}
    if "error" in r:
        return dict(rep, error=r["error"])
    grads = cuda_sim.gradient_outputs(graph)
    wrt = dict(zip(grads, graph.meta["grad"]["wrt"])) if grads else {}
    floor, bounds = r["rounding_floor"] or {}, r["bounds"]
    rep["outputs"] = [dict({"name": k, "error": e, "bound": bounds[k], "float32_error": r["float32_errors"][k],
                            "rounding_floor": floor.get(k), "ok": e <= bounds[k]},
                           **({"gradient_of": wrt[k]} if k in wrt else {})) for k, e in r["errors"].items()]
    rep.update(worst=r["worst"], max_err=r["max_err"], beyond_float64=r["beyond_float64"], stepwise=r["stepwise"])
    return rep


def _name(o):
    return f"{o['name']} (gradient of {o['gradient_of']})" if "gradient_of" in o else o["name"]


def text(rep):
    """The report as lines of text."""
    what = f"{rep['case']} at batch {rep['batch']}, {rep['dtype']}"
    lines = [f"verify {rep['model']} ({what}) on {rep['target']} against float64"]
    if "error" in rep:
        return "\n".join(lines + [f"  {rep['error']}", "FAILED"])
    bad = [o for o in rep["outputs"] if not o["ok"]]
    worst = next(o for o in rep["outputs"] if o["name"] == rep["worst"])
    lines.append(f"  {len(rep['outputs']) - len(bad)}/{len(rep['outputs'])} outputs within their bounds; nearest: "
                 f"{_name(worst)} {worst['error']:.2e} (bound {worst['bound']:.2e})")
    lines += [f"  {_name(o)}: {o['error']:.2e} over its bound {o['bound']:.2e}" for o in bad[:10]]
    if rep["beyond_float64"]:
        sw = rep["stepwise"]
        lines.append(f"  {len(rep['beyond_float64'])} outputs beyond what float64 can judge at {rep['dtype']} (rounding "
                     f"floor over {cuda_sim.FLOOR_CAP / cuda_sim.PEER_FACTOR:g}): launch by launch "
                     + (f"{sw['checked']}/{sw['steps']} steps pass" if sw and sw["ok"] else
                        f"fails at step {sw['failing_step']} ({sw['failing_func']})" if sw else "not run"))
    lines.append("guard zones clean" if rep["guards_clean"] else "guard zones WRITTEN")
    lines.append("OK" if rep["ok"] else "FAILED")
    return "\n".join(lines)
