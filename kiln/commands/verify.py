"""kiln verify MODEL --golden G.npz --target T: every golden pair must match on the target."""
from __future__ import annotations

import os
import time

import numpy as np

from kiln.backends import cuda_sim, get_backend, is_package
from kiln.commands import BuildFolder
from kiln.commands.labgrid_options import add_farm_arguments, farm_lease
from kiln.errors import UsageError
from kiln.samples import golden_pairs, read_npz
from kiln.targets import get_target, run_target
from kiln.tflm import add_semantics_argument, check_package_semantics


def add_arguments(p):
    p.add_argument("model", help="model file (.tflite or Kiln graph .json) or a compiled package folder; with "
                   "--float64 also a zoo model name or a .py model file")
    p.add_argument("--golden", help=".npz of golden pairs: in_K/out_K (one input and output), or "
                   "in_K_J/out_K_J for input/output J of pair K (see `kiln golden`); required unless --float64")
    p.add_argument("--target", default="reference",
                   help="reference | host | host-llvm | cuda | a board name (see `kiln boards`)")
    p.add_argument("--atol", type=float, default=None, help="tolerance for float outputs (default: the target's)")
    p.add_argument("--max-report", type=int, default=10, help="mismatching elements to list per pair")
    p.add_argument("-o", "--out", default=None, metavar="DIR",
                   help="build folder of a target that builds something (a board's package and firmware, a "
                        "CUDA package, the host target's package); default: a temporary folder, removed "
                        "afterwards unless --keep (the host target then uses its per-model cache)")
    p.add_argument("--keep", action="store_true", help="keep the temporary build folder (its path is reported)")
    p.add_argument("--stepwise", action="store_true",
                   help="cuda-sim only: also check the package launch by launch, each plan step's kernels on "
                        "pocl against the step's unscheduled function on the same bytes (see docs/server_targets.md)")
    f64 = p.add_argument_group("against float64 (cuda-sim, float models; instead of --golden)")
    f64.add_argument("--float64", action="store_true",
                     help="compile the float model (or, with --train-step, its training step) as a CUDA package, run "
                          "it on cuda-sim with seeded random inputs and compare every output, gradient and buffer "
                          "update with the graph computed in float64, each within its stated bound (see "
                          "docs/server_targets.md, 'The model zoo against float64')")
    f64.add_argument("--train-step", action="store_true", help="--float64: check the model's training step "
                     "(forward, its loss, backward, BatchNorm buffer updates) instead of its inference graph")
    f64.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                     help="--float64: the CUDA package's storage dtype (half training steps: mixed precision)")
    f64.add_argument("--batch", type=int, default=None, help="--float64: batch size (default 1; 64 for --train-step)")
    f64.add_argument("--seed", type=int, default=0, help="--float64: seed of the inputs and initial parameters")
    add_semantics_argument(p)
    add_farm_arguments(p)


def load_golden(path):
    """[(inputs, outputs)] golden pairs, each side a tuple of arrays (kiln.samples: in_K/out_K, or
    in_K_J/out_K_J for models with several inputs or outputs)."""
    return golden_pairs(read_npz(path), os.fspath(path))


def comparison_rule(exact, atol):
    """How a target's outputs are compared (the report's "comparison")."""
    floats = f"within atol {atol:g} (x (1 + |expected|))"
    return f"bit-exact (integer outputs); float outputs {floats}" if exact else floats


def compare(got, want, exact, atol, max_report=10):
    got = np.asarray(got)
    want = np.asarray(want)
    if got.shape != want.shape:
        return {"match": False, "reason": f"shape {got.shape} != expected {want.shape}", "mismatches": []}
    if exact:
        bad = np.argwhere(got != want)
    else:
        # |got - want| <= atol * (1 + |want|): absolute near zero, relative for large values (a float
        # model's sums differ in their last bits between targets: FMA contraction, summation order)
        bad = np.argwhere(~np.isclose(got.astype(np.float64), want.astype(np.float64), atol=atol, rtol=atol))
    mism = [{"index": [int(i) for i in idx], "got": got[tuple(idx)].item(), "expected": want[tuple(idx)].item()}
            for idx in bad[:max_report]]
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    return {"match": len(bad) == 0, "mismatched_elements": int(len(bad)), "elements": int(want.size),
            "max_abs_diff": float(diff.max()) if diff.size else 0.0, "mismatches": mism}


def stepwise_check(model, pairs, options):
    """cuda_sim.stepwise on the CUDA package behind ``model`` with each golden pair's inputs: the
    report's "stepwise" object (the first failing pair's, else the one with the worst step)."""
    p = os.fspath(model)
    pkg = get_backend("cuda").load(p if is_package(p) else options["package"], interpret=True)
    sim, reps = cuda_sim.Simulator(pkg.path), []
    for k, (xs, _) in enumerate(pairs):
        r = cuda_sim.stepwise(pkg.path, pkg._inputs(xs, None), sim=sim)
        reps.append(dict(r, pair=k, per_step=[{"step": s["step"], "func": s["func"], "err": s["err"],
                                               "bound": s["bound"], "ok": s["ok"]} for s in r["per_step"]]))
        if not r["ok"]:
            return reps[-1]
    return max(reps, key=lambda r: r["worst_err"] / r["worst_bound"] if r["worst_bound"] else r["worst_err"])


def _err(v):
    return "infinite (NaN left, or bytes changed outside its arguments)" if v is None else f"{v:.2e}"


def verify(model, golden, target, atol=None, max_report=10, options=None, keep=False, stepwise=False):
    """Run the golden inputs on ``target`` and compare. ``options["out"]``: the build folder of a
    target that builds something (a board, cuda); without it a temporary folder is used and removed
    afterwards unless ``keep`` (the report's "build" names a folder that was kept). ``stepwise``
    (cuda-sim): also check the package launch by launch (stepwise_check)."""
    if stepwise and target != "cuda-sim":
        raise UsageError(f"--stepwise checks a CUDA package on cuda-sim: use --target cuda-sim (not {target!r})")
    t = get_target(target)
    pairs = load_golden(golden)
    options = dict(options or {})
    if options.get("out"):
        options.setdefault("out_dir", os.path.join(options["out"], "host_package"))
    t0 = time.time()
    with BuildFolder(options.get("out"), keep, "kiln_verify_") as build:
        options["out"] = build.path
        options.setdefault("package", os.path.join(build.path, "cuda_package"))
        outs = run_target(t, model, [p[0] for p in pairs], options)
        steps = stepwise_check(model, pairs, options) if stepwise else None
    elapsed = time.time() - t0
    if atol is None:
        atol = t.tolerance(model, options)
    exact_target = t.is_exact(model, options)
    results = []
    for k, ((_, wants), gots) in enumerate(zip(pairs, outs)):
        if len(gots) != len(wants):
            results.append({"pair": k, "match": False, "mismatches": [],
                            "reason": f"the model gave {len(gots)} outputs, the golden pair has {len(wants)}"})
            continue
        per = []
        for j, (got, want) in enumerate(zip(gots, wants)):
            exact = exact_target and want.dtype.kind in "iu"
            r = compare(got, want, exact, atol, max_report)
            r["output"] = j
            if len(wants) > 1:
                for m in r["mismatches"]:
                    m["output"] = j
            per.append(r)
        r = dict(per[0]) if len(per) == 1 else {
            "match": all(p["match"] for p in per), "mismatches": [m for p in per for m in p["mismatches"]],
            "mismatched_elements": sum(p.get("mismatched_elements", 0) for p in per),
            "elements": sum(p.get("elements", 0) for p in per),
            "max_abs_diff": max(p.get("max_abs_diff", 0.0) for p in per), "outputs": per}
        if len(per) > 1 and not r["match"]:
            bad = [p for p in per if not p["match"]]
            if any("reason" in p for p in bad):
                r["reason"] = "; ".join(f"output {p['output']}: {p['reason']}" for p in bad if "reason" in p)
        r["pair"] = k
        results.append(r)
    ok = all(r["match"] for r in results) and len(outs) == len(pairs) and (steps is None or steps["ok"])
    extra = {} if steps is None else {"stepwise": steps}
    return {**extra, "ok": ok, "model": str(model), "golden": str(golden), "target": target, "pairs": len(pairs),
            "matched": sum(r["match"] for r in results), "seconds": round(elapsed, 3),
            "comparison": comparison_rule(exact_target, atol),
            "build": build.kept, "results": results}


def run(args):
    if args.float64 or args.train_step:
        return run_float64(args)
    if not args.golden:
        raise UsageError("kiln verify needs --golden G.npz (golden pairs: see `kiln golden`), or --float64 "
                         "(cuda-sim: a float model against float64)")
    with farm_lease(args) as lease:
        options = {"out": args.out} if args.out else {}
        if args.semantics:
            check_package_semantics(args.model, args.semantics)
            options["semantics"] = args.semantics
        if lease is not None:       # a labgrid place: its board, over its serial port
            if args.target not in ("reference", lease.board):
                raise UsageError(f"--labgrid: the place holds a {lease.board}: give no --target (or that one)")
            args.target = lease.board
            options.update(port=lease.url, lease=lease)
        rep = verify(args.model, args.golden, args.target, args.atol, args.max_report,
                     options=options or None, keep=args.keep, stepwise=args.stepwise)
        if lease is not None:
            rep["labgrid"] = {"place": lease.place_name, "board": lease.board, "coordinator": lease.address,
                              "url": options["port"]}
    lines = [f"verify {rep['model']} on {rep['target']}: {rep['matched']}/{rep['pairs']} golden pairs match"]
    for r in rep["results"]:
        if not r["match"]:
            lines.append(f"  pair {r['pair']}: {r.get('reason') or str(r['mismatched_elements']) + ' of ' + str(r['elements']) + ' elements differ'}"
                         f" (max |diff| {r.get('max_abs_diff', 'n/a')})")
            for m in r["mismatches"]:
                where = f"output {m['output']} " if "output" in m else ""
                lines.append(f"    {where}at {m['index']}: got {m['got']}, expected {m['expected']}")
    if "stepwise" in rep:
        sw = rep["stepwise"]
        lines.append(f"stepwise: {sw['checked']}/{sw['steps']} plan steps checked against their unscheduled "
                     f"functions, worst error {_err(sw['worst_err'])} (bound {sw['worst_bound']:.2e}) at step "
                     f"{sw['worst_step']}")
        if not sw["ok"]:
            lines.append(f"  first failing step {sw['failing_step']} ({sw['failing_func']}, kernels "
                         f"{', '.join(sw['failing_kernel'])}): {sw['failing_value']} differs")
    if rep["build"] and not args.out:
        lines.append(f"build folder kept: {rep['build']}")
    lines.append("OK" if rep["ok"] else "FAILED")
    rep["text"] = "\n".join(lines)
    return rep


def run_float64(args):
    """kiln verify --float64 (kiln/commands/verify64.py)."""
    from kiln.commands import verify64
    if args.train_step and not args.float64:
        raise UsageError("--train-step is checked against float64: add --float64")
    if args.golden or args.stepwise:
        raise UsageError("--float64 compares with float64, not golden pairs (drop --golden), and runs the "
                         "launch-by-launch check itself where float64 cannot judge (drop --stepwise)")
    rep = verify64.verify64(args.model, args.target, args.dtype, args.train_step, args.batch, args.seed,
                            args.out, args.keep)
    rep["text"] = verify64.text(rep)
    return rep
