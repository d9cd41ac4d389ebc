"""GPU benchmark: Kiln CUDA packages vs PyTorch eager vs torch.compile(mode="reduce-overhead").

For each zoo model (NHWC, as Kiln traces it; PyTorch runs the same graph through
benchmarks/torch_graph.py, convolutions on channels-last views):
  * latency at batch 1 (inference, eval mode), median of CUDA-event timings, Kiln replaying its
    captured CUDA graph
  * throughput at batch 64 (inference), images/s
  * training step at batch 64 (forward + loss + backward; Kiln: compile_train_step package)
Every Kiln package is first checked against the NumPy reference run in float64 (errors relative
to each output's scale, gradients to the step's largest; bounds of kiln.backends.cuda_sim.bounds64:
1e-4 for float32, or 4x NumPy's own float32 error where larger). With --sanitize, the
digits-cnn training step and ds-cnn inference at batch 64 then run under compute-sanitizer
memcheck and racecheck (benchmarks/gpu_check.py). Writes a Markdown table.

    python benchmarks/gpu_bench.py --models digits-cnn,resnet8 --markdown gpu.md [--arch sm_90] [--sanitize]

On a GPU server without TVM, time the packages that `benchmarks/gpu_check.py --prepare DIR` built
elsewhere (each is checked against its float64 bounds first, as gpu_check does):

    python3 benchmarks/gpu_bench.py --packages DIR --markdown gpu.md [--modes eager]

Needs an NVIDIA GPU, CuPy and a CUDA build of PyTorch. Not run in CI (no GPU there): the numbers
in docs/ come only from a run of this script on a named GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_check  # noqa: E402


def torch_time_ms(fn, iters=100, warmup=10):
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return float(np.median(ts))


def _model(name, batch, train):
    from kiln.frontend.trace import trace
    from kiln.frontend.types import TensorType
    from kiln.training import zoo
    from kiln.training.step import StepGraph
    zm = zoo.get(name)
    shape = (batch,) + tuple(zm.input_shape[1:])
    if train:
        sg = StepGraph(zm.module, zm.loss, zm.input_shape[1:], batch)
        return zm, sg, sg.graph, sg.forward_graph
    zm.module.eval()
    g = trace(zm.module, TensorType(shape), name=f"{name}_b{batch}")
    return zm, None, g, g


def kiln_case(name, batch, train, arch, dtype, workdir, iters):
    from kiln.backends import cuda, cuda_sim
    from kiln.backends.cuda_runner import CudaRunner, scaled_errors
    zm, sg, g, _ = _model(name, batch, train)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch,) + tuple(zm.input_shape[1:])).astype(np.float32)
    if train:
        y = rng.integers(0, zm.num_classes or 2, batch) if sg.target_input == "labels" else None
        feeds = sg.feeds(x, y, 1)
        inputs = [feeds[k] for k in g.inputs]
        pkg = cuda.compile_train_step(g, os.path.join(workdir, f"{name}-train-{batch}"), arch=arch, dtype=dtype)
    else:
        inputs = [x]
        pkg = cuda.compile(g, os.path.join(workdir, f"{name}-{batch}"), arch=arch, dtype=dtype)
    r = CudaRunner(pkg)
    got = r(*inputs)
    want, upd = cuda_sim.reference64(g, inputs)
    bound, _, _ = cuda_sim.bounds64(g, inputs, want, upd, dtype, storage=cuda_sim.storage_map(r.m))
    errs = scaled_errors(g.outputs, got, want, cuda_sim.gradient_outputs(g))
    err = max(errs.values())
    bad = [f"{k} {errs[k]:.2e} > {bound[k]:.2e}" for k in errs if errs[k] > bound[k]]
    if bad:
        raise AssertionError(f"{name} batch {batch} ({'train' if train else 'infer'}): Kiln CUDA differs from "
                             f"the float64 reference (relative to the output's scale) beyond its bound: "
                             f"{'; '.join(bad[:5])}")
    if not r.guards_clean():
        raise AssertionError(f"{name} batch {batch}: a kernel wrote into a guard zone of the arena or weights")
    r.capture()
    return r.time_ms(*inputs, iters=iters), err, inputs


def torch_case(name, batch, train, mode, iters):
    import torch
    import torch_graph
    zm, sg, g, fg = _model(name, batch, train)
    dev = "cuda"
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch,) + tuple(zm.input_shape[1:])).astype(np.float32)
    feeds = {"x": x}
    if train and sg.target_input is not None:
        feeds[sg.target_input] = (rng.integers(0, zm.num_classes or 2, batch) if sg.target_input == "labels"
                                  else rng.standard_normal(g.types[sg.target_input].shape).astype(np.float32))
    params = torch_graph.to_torch(dict(fg.params), requires_grad=set(fg.params) if train else (), device=dev)
    consts = torch_graph.to_torch(dict(fg.consts), device=dev)
    tfeeds = torch_graph.to_torch({k: v for k, v in feeds.items() if k in fg.inputs}, device=dev)

    def fwd(feeds_):
        return torch_graph.run(fg, feeds_, {**params, **consts})

    if train:
        def step(feeds_):
            for p in params.values():
                p.grad = None
            fwd(feeds_)[0].backward()
        fn = step
    else:
        def fn(feeds_):
            with torch.no_grad():
                return fwd(feeds_)
    if mode == "compile":
        fn = torch.compile(fn, mode="reduce-overhead")
    return torch_time_ms(lambda: fn(tfeeds), iters=iters)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="digits-cnn,ds-cnn,resnet8,mobilenet-v1-0.25,fc-autoencoder",
                   help="comma-separated zoo models (default: all five)")
    p.add_argument("--arch", default=None, help="CUDA architecture, e.g. sm_90 (default: the device's sm_XY)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                   help="storage dtype of Kiln's packages (default: float32)")
    p.add_argument("--iters", type=int, default=100, help="timed iterations per case (default: 100)")
    p.add_argument("--markdown", metavar="PATH", help="also write the table to this file (nothing is written without it)")
    p.add_argument("--keep", action="store_true",
                   help="keep the temporary folder with the CUDA packages (removed by default)")
    p.add_argument("--sanitize", action="store_true",
                   help="also run a zoo training step and inference under compute-sanitizer memcheck and racecheck")
    p.add_argument("--packages", metavar="DIR",
                   help="time the packages in DIR (made by benchmarks/gpu_check.py --prepare) instead of compiling "
                        "them: no TVM needed")
    p.add_argument("--modes", default="eager,compile", help="PyTorch modes to time (default: eager,compile)")
    p.add_argument("--cases", default="b1,b64,train", help="cases to run (default: b1,b64,train)")
    a = p.parse_args(argv)
    if a.packages:
        gpu_check._import_runner()       # Kiln from this checkout where it is not installed
    import torch

    from kiln.backends.cuda_runner import CudaUnavailable, probe
    try:
        cupy, cc = probe(a.arch or "sm_50")
    except CudaUnavailable as e:
        print(f"gpu_bench: {e}", file=sys.stderr)
        return 2
    arch = a.arch or f"sm_{cc}"
    gpu = torch.cuda.get_device_name()
    work = a.packages or tempfile.mkdtemp(prefix="kiln-gpu-bench-")
    try:
        rows = _bench_all(a, arch, work)
    finally:
        if a.keep and not a.packages:
            print(f"CUDA packages kept in {work}", file=sys.stderr)
        elif not a.packages:
            shutil.rmtree(work, ignore_errors=True)
    _report(rows, a, arch, gpu, torch, cupy)
    if a.sanitize:
        return _sanitize()
    return 0


def _sanitize():
    """gpu_check.py on the digits-cnn training step and ds-cnn at batch 64 (float32), with
    compute-sanitizer memcheck and racecheck; prints its JSON line, returns its exit status."""
    with tempfile.TemporaryDirectory(prefix="kiln-gpu-sanitize-") as d:
        gpu_check.prepare(d, ["digits-cnn"], ["train"], ["float32"])
        gpu_check.prepare(d, ["ds-cnn"], ["b64"], ["float32"])
        return subprocess.run([sys.executable, gpu_check.__file__, d, "--iters", "0"]).returncode


CASES = (("b1", 1, False), ("b64", 64, False), ("train", 64, True))


def prepared_case(folder, model, key, dtype, iters):
    """(ms, max error) of a package gpu_check.py --prepare built, checked against its float64 bounds."""
    with open(os.path.join(folder, "cases.json")) as f:
        cases = {c["case"]: c for c in json.load(f)}
    name = f"{model}-{key}-{dtype}"
    if name not in cases:
        raise SystemExit(f"{folder}/cases.json has no case {name!r}: prepare it with benchmarks/gpu_check.py "
                         f"--prepare {folder} --models {model} --cases {key} --dtypes {dtype}")
    rec = gpu_check.check_case(gpu_check._import_runner(), folder, cases[name], iters)
    if not rec["ok"]:
        raise AssertionError(f"{name}: {rec}")
    return rec["ms"], rec["plain_err"]


def _bench_all(a, arch, work):
    rows = []
    for m in a.models.split(","):
        m = m.strip()
        r = {"model": m}
        for key, batch, train in CASES:
            if key not in a.cases.split(","):
                continue
            if a.packages:
                r[f"kiln_{key}_ms"], r[f"err_{key}"] = prepared_case(a.packages, m, key, a.dtype, a.iters)
            else:
                r[f"kiln_{key}_ms"], r[f"err_{key}"], _ = kiln_case(m, batch, train, arch, a.dtype, work, a.iters)
            for mode in ("eager", "compile"):
                r[f"{mode}_{key}_ms"] = float("nan")
                if mode in a.modes.split(","):
                    try:
                        r[f"{mode}_{key}_ms"] = torch_case(m, batch, train, mode, a.iters)
                    except Exception as e:  # noqa: BLE001 - the baseline failing is reported, Kiln's row stays
                        print(f"gpu_bench: PyTorch {mode} {m} {key}: {type(e).__name__}: {e}", file=sys.stderr)
        rows.append(r)
        print(r, flush=True)
    return rows


def _report(rows, a, arch, gpu, torch, cupy):
    head = ("| model | b1 latency ms: Kiln / eager / compile | b64 img/s: Kiln / eager / compile | "
            "train step b64 ms: Kiln / eager / compile | Kiln max rel err |\n|---|---|---|---|---|")
    lines = [head]

    def cell(r, key, fmt, f=lambda v: v):
        vals = [r.get(f"{k}_{key}_ms") for k in ("kiln", "eager", "compile")]
        return " / ".join("—" if v is None or v != v else format(f(v), fmt) for v in vals)
    for r in rows:
        errs = [v for k, v in r.items() if k.startswith("err_")]
        lines.append(f"| {r['model']} | {cell(r, 'b1', '.3f')} | {cell(r, 'b64', '.0f', lambda v: 64e3 / v)} | "
                     f"{cell(r, 'train', '.2f')} | {max(errs):.1e} |")
    out = "\n".join(lines) + f"\n\nGPU: {gpu} ({arch}), dtype {a.dtype}, torch {torch.__version__}, CuPy {cupy.__version__}.\n"
    print(out)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(out)


if __name__ == "__main__":
    sys.exit(main())
