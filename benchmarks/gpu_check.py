"""Check pre-built Kiln CUDA packages on a GPU: outputs against float64, guard zones, CUDA graph
replay, and compute-sanitizer (memcheck, racecheck). Prints one JSON object.

Two halves, on two machines:

    # where Kiln and TVM are installed: compile the zoo's packages, save inputs and float64 outputs
    .venv/bin/python benchmarks/gpu_check.py --prepare DIR [--models digits-cnn,ds-cnn] \\
        [--cases b1,b64,train] [--dtypes float32,float16,bfloat16]

    # on the GPU machine (imports only numpy, cupy and Kiln's runner modules: no TVM, no torch;
    # Kiln need not be installed, the checkout holding this file is enough)
    python3 benchmarks/gpu_check.py DIR [--only SUBSTR] [--sanitize memcheck,racecheck]
        [--sanitize-cases digits-cnn-train-float32]

Each case folder DIR/MODEL-CASE-DTYPE holds a CUDA package (manifest, kernels.cu, weights), and
DIR/MODEL-CASE, shared by the dtypes, ``inputs.npz`` (in0, in1, ...) and ``expected.npz`` (out0,
..., then upd0, ... for train-mode BatchNorm buffer updates) computed by the NumPy executor in
float64 from the same inputs; DIR/cases.json lists the cases with their output names, which
outputs are gradients, and each output's bound: errors are relative to each output's scale,
gradients to the step's largest (kiln.backends.cuda_runner.scaled_errors), and the bound is the
dtype's tolerance or 4x the NumPy executor's own float32 error where that is larger
(kiln.backends.cuda_sim.bounds64). Exit status 0 when every case is within its bounds with clean
guard zones and every sanitizer run is clean, 1 when a check failed, 2 when no GPU/CuPy was found.
"""
from __future__ import annotations

import argparse
import importlib.abc
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the checkout's folders of the kiln.* packages (pyproject.toml [tool.setuptools] package-dir)
PACKAGE_DIRS = {"kiln": "kiln", "kiln.common": "common", "kiln.frontend": "frontend", "kiln.autodiff": "autodiff",
                "kiln.training": "training", "kiln.quantize": "quantize", "kiln.backends": "backends",
                "kiln.firmware": "firmware", "kiln.boards": "boards"}


class _Checkout(importlib.abc.MetaPathFinder):
    """Imports kiln.* from this checkout's folders when Kiln is not installed."""

    def find_spec(self, name, path=None, target=None):
        if name not in PACKAGE_DIRS:
            return None
        d = os.path.join(ROOT, PACKAGE_DIRS[name])
        return importlib.util.spec_from_file_location(name, os.path.join(d, "__init__.py"),
                                                      submodule_search_locations=[d])


def _import_runner():
    if importlib.util.find_spec("kiln") is None:
        sys.meta_path.insert(0, _Checkout())
    from kiln.backends import cuda_runner
    return cuda_runner


# ---- --prepare (needs Kiln with TVM) -----------------------------------------------------------
def prepare(out, models, cases, dtypes):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import cuda_sim_zoo

    from kiln.backends import cuda, cuda_sim
    os.makedirs(out, exist_ok=True)
    listed = []
    if os.path.exists(os.path.join(out, "cases.json")):      # adding to a folder: keep its other cases
        with open(os.path.join(out, "cases.json")) as f:
            listed = json.load(f)
    for m in models:
        for c in cases:
            batch, train = cuda_sim_zoo.CASES[c]
            graph, inputs = cuda_sim_zoo.zoo_case(m, batch, train)
            want, upd = cuda_sim.reference64(graph, inputs)
            _, peer, _ = cuda_sim.bounds64(graph, inputs, want, upd, "float32")
            data = os.path.join(out, f"{m}-{c}")           # shared by the case's dtypes
            os.makedirs(data, exist_ok=True)
            np.savez(os.path.join(data, "inputs.npz"), **{f"in{i}": x for i, x in enumerate(inputs)})
            np.savez(os.path.join(data, "expected.npz"), **{f"out{i}": w for i, w in enumerate(want)},
                     **{f"upd{i}": upd[b] for i, b in enumerate(upd)})
            for dt in dtypes:
                name = f"{m}-{c}-{dt}"
                pkg = os.path.join(out, name)
                (cuda.compile_train_step if train else cuda.compile)(graph, pkg, dtype=dt, check=False)
                floor = None if dt == "float32" else cuda_sim.rounding_floor64(graph, inputs, want, upd, dt,
                                                                               storage=cuda_sim.storage_map(cuda.load_manifest(pkg)))
                for f in ("groups.json", "scheduled.json", "kernels.cl"):     # not read by the runner
                    if os.path.exists(os.path.join(pkg, f)):
                        os.remove(os.path.join(pkg, f))
                listed = [c for c in listed if c["case"] != name]
                listed.append({"case": name, "data": f"{m}-{c}", "model": m, "batch": batch, "train": train,
                               "dtype": dt, "outputs": list(graph.outputs) + [f"update:{b}" for b in upd],
                               "gradients": cuda_sim.gradient_outputs(graph),
                               "tolerance": cuda_sim.TOLERANCE64[dt], "float32_errors": peer, "rounding_floor": floor,
                               "bounds": cuda_sim.bounds_from(dt, peer, floor)})
                print(name, file=sys.stderr, flush=True)
    with open(os.path.join(out, "cases.json"), "w") as f:
        json.dump(listed, f, indent=1)
    return listed


# ---- on the GPU --------------------------------------------------------------------------------
def _load(folder, case):
    pkg, data = os.path.join(folder, case["case"]), os.path.join(folder, case["data"])
    ins, exp = np.load(os.path.join(data, "inputs.npz")), np.load(os.path.join(data, "expected.npz"))
    n_upd = sum(1 for k in exp.files if k.startswith("upd"))
    want = [exp[f"out{i}"] for i in range(len(case["outputs"]) - n_upd)] + [exp[f"upd{i}"] for i in range(n_upd)]
    return pkg, [ins[f"in{i}"] for i in range(len(ins.files))], want


def check_case(runner, folder, case, iters):
    """Run one case on the GPU: plain and as a replayed CUDA graph, against float64."""
    pkg, inputs, want = _load(folder, case)
    rec = {"case": case["case"], "tolerance": case["tolerance"]}
    t0 = time.perf_counter()
    r = runner.CudaRunner(pkg)
    rec["nvrtc_s"] = round(time.perf_counter() - t0, 2)
    for how in ("plain", "graph"):
        if how == "graph":
            r.capture()
        outs, upd = r.run_updates(*inputs)
        got = list(outs) + [upd[n.split(":", 1)[1]] for n in case["outputs"][len(outs):]]
        errs = runner.scaled_errors(case["outputs"], got, want, case["gradients"])
        bound = case["bounds"]
        worst = max(errs, key=lambda k: errs[k] / bound[k])
        rec[f"{how}_err"], rec[f"{how}_worst"] = max(errs.values()), f"{worst}: {errs[worst]:.2e} / {bound[worst]:.2e}"
        rec[f"{how}_ok"] = all(errs[k] <= bound[k] for k in errs)
    rec["guards_clean"] = bool(r.guards_clean())
    if iters:
        rec["ms"] = round(r.time_ms(*inputs, iters=iters), 4)
    rec["ok"] = rec["guards_clean"] and rec["plain_ok"] and rec["graph_ok"]
    return rec


def sanitize(folder, case, tool):
    """This script on one case (no timing) under compute-sanitizer --tool ``tool``."""
    exe = shutil.which("compute-sanitizer")
    cmd = [exe, "--tool", tool, "--error-exitcode", "3", "--print-limit", "20", sys.executable,
           os.path.abspath(__file__), folder, "--only", case, "--exact", "--iters", "0", "--sanitize", ""]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    tail = (p.stdout + p.stderr).strip().splitlines()
    summary = [ln for ln in tail if "ERROR SUMMARY" in ln or "RACECHECK SUMMARY" in ln]
    return {"case": case, "tool": tool, "rc": p.returncode, "ok": p.returncode == 0,
            "summary": summary[-1] if summary else None, "s": round(time.perf_counter() - t0, 1),
            **({} if p.returncode == 0 else {"log": "\n".join(tail[-40:])})}


def _sanitize_cases(arg, cases):
    """The cases named in ``arg`` (comma-separated), or by default the first float32 training
    step and the first float32 batch-64 inference of the folder (the smallest model first)."""
    if arg:
        return [c for c in arg.split(",") if c]
    f32 = [c for c in cases if c["dtype"] == "float32"]
    train = [c["case"] for c in f32 if c["train"]][:1]
    infer = [c["case"] for c in f32 if not c["train"] and c["batch"] > 1][:1]
    return train + infer


def run_checks(a):
    try:
        runner = _import_runner()
        cupy, cc = runner.probe("sm_50")
    except Exception as e:   # noqa: BLE001 - CudaUnavailable, or Kiln not importable
        print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"}))
        return 2
    with open(os.path.join(a.folder, "cases.json")) as f:
        cases = [c for c in json.load(f) if not a.only or (c["case"] == a.only if a.exact else a.only in c["case"])]
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props.get("name", b"?")
    res = {"device": name.decode() if isinstance(name, bytes) else name, "cc": cc, "cupy": cupy.__version__,
           "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(), "nvrtc": list(cupy.cuda.nvrtc.getVersion()),
           "include_dirs": runner.include_dirs(runner._nvrtc_major(cupy)), "cases": [], "sanitizer": []}
    for c in cases:
        try:
            rec = check_case(runner, a.folder, c, a.iters)
        except Exception as e:   # noqa: BLE001 - reported per case, the others still run
            rec = {"case": c["case"], "ok": False, "error": f"{type(e).__name__}: {e}"[:3000]}
        res["cases"].append(rec)
        print(json.dumps(rec), file=sys.stderr, flush=True)
    tools = [t for t in a.sanitize.split(",") if t]
    if tools and shutil.which("compute-sanitizer") is None:
        res["sanitizer"].append({"ok": False, "error": "compute-sanitizer not on PATH"})
    elif tools:
        names = {c["case"] for c in cases}
        for case in _sanitize_cases(a.sanitize_cases, cases):
            for tool in tools:
                res["sanitizer"].append(sanitize(a.folder, case, tool) if case in names else
                                        {"case": case, "tool": tool, "ok": False,
                                         "error": f"no case {case!r} in {a.folder}/cases.json (with --only)"})
                print(json.dumps(res["sanitizer"][-1]), file=sys.stderr, flush=True)
    res["ok"] = bool(res["cases"]) and all(r["ok"] for r in res["cases"] + res["sanitizer"])
    print(json.dumps(res))
    return 0 if res["ok"] else 1


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", nargs="?", help="folder made by --prepare (GPU mode)")
    p.add_argument("--prepare", metavar="DIR", help="compile the packages and float64 expectations into DIR")
    p.add_argument("--models", default="digits-cnn,fc-autoencoder,ds-cnn,resnet8,mobilenet-v1-0.25")
    p.add_argument("--cases", default="b1,b64,train")
    p.add_argument("--dtypes", default="float32,float16,bfloat16")
    p.add_argument("--only", help="GPU mode: only cases whose name contains this")
    p.add_argument("--exact", action="store_true", help="--only names one case exactly")
    p.add_argument("--iters", type=int, default=20, help="timed runs per case (0: no timing)")
    p.add_argument("--sanitize", default="memcheck,racecheck", help="compute-sanitizer tools ('' for none)")
    p.add_argument("--sanitize-cases", default="",
                   help="cases run under compute-sanitizer (default: the folder's first float32 training step "
                        "and first float32 batch-64 inference)")
    a = p.parse_args(argv)
    if a.prepare:
        sys.path.insert(0, ROOT)
        listed = prepare(a.prepare, a.models.split(","), a.cases.split(","), a.dtypes.split(","))
        print(json.dumps({"prepared": a.prepare, "cases": [c["case"] for c in listed]}))
        return 0
    if not a.folder:
        p.error("give the folder made by --prepare, or --prepare DIR")
    return run_checks(a)


if __name__ == "__main__":
    sys.exit(main())
