"""Training-step time on the host CPU: Kiln host-llvm vs PyTorch eager vs the NumPy reference.

For each zoo model: the training-step graph (kiln.training.step.StepGraph: forward in train mode
+ loss + backward, BatchNorm statistics as buffer updates) at one batch size, compiled with
backends/llvm_host.py, checked against the NumPy reference (max relative error), then timed
(median of N steps) next to the same graph run with PyTorch eager ops and ``loss.backward()``
(benchmarks/torch_graph.py) at the same thread count.

    .venv/bin/python benchmarks/host_llvm_bench.py --models digits-cnn,ds-cnn --batch 32 --threads 2
    .venv/bin/python benchmarks/host_llvm_bench.py --markdown out.md

Numbers depend on the machine and on its load (this repo is developed on 2 shared cores): run
it idle and report the machine with the table.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def median_ms(f, n, warmup=2):
    for _ in range(warmup):
        f()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts)) * 1e3


def bench_model(name, batch, threads, iters, numpy_iters=2):
    import torch
    import torch_graph

    from kiln.backends import llvm_host
    from kiln.frontend import executor
    from kiln.training import zoo
    from kiln.training.step import StepGraph
    zm = zoo.get(name)
    sg = StepGraph(zm.module, zm.loss, zm.input_shape[1:], batch)
    g = sg.graph
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch,) + tuple(zm.input_shape[1:])).astype(np.float32)
    y = rng.integers(0, zm.num_classes or 2, batch) if sg.target_input == "labels" else None
    feeds = sg.feeds(x, y, 7)
    t0 = time.time()
    cg = llvm_host.compile(g, num_threads=threads)
    build = time.time() - t0
    ref = executor.run(g, feeds=feeds)
    got = cg(feeds=feeds)
    err = max(float(np.max(np.abs(a - b) / (1.0 + np.abs(b)))) if a.size else 0.0 for a, b in zip(got, ref))
    kiln_ms = median_ms(lambda: cg.run_tvm(feeds=feeds), iters)
    np_ms = median_ms(lambda: executor.run(g, feeds=feeds), numpy_iters, warmup=0)

    torch.set_num_threads(threads)
    fg = sg.forward_graph
    params = torch_graph.to_torch(dict(fg.params), requires_grad=set(fg.params))
    consts = torch_graph.to_torch(dict(fg.consts))
    tfeeds = torch_graph.to_torch({k: v for k, v in feeds.items() if k in fg.inputs})

    def torch_step():
        for p in params.values():
            p.grad = None
        loss = torch_graph.run(fg, tfeeds, {**params, **consts})[0]
        loss.backward()
    torch_ms = median_ms(torch_step, iters)
    return {"model": name, "batch": batch, "threads": threads, "nodes": len(g.nodes), "build_s": round(build, 1),
            "cached": cg.cached, "max_rel_err": err, "kiln_ms": kiln_ms, "torch_ms": torch_ms, "numpy_ms": np_ms,
            "speedup_vs_torch": torch_ms / kiln_ms}


def table(rows):
    head = ("| model | batch | threads | step nodes | Kiln host-llvm ms | PyTorch eager ms | NumPy ref ms | "
            "Kiln vs torch | max rel err |\n|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        lines.append(f"| {r['model']} | {r['batch']} | {r['threads']} | {r['nodes']} | {r['kiln_ms']:.2f} | "
                     f"{r['torch_ms']:.2f} | {r['numpy_ms']:.1f} | {r['speedup_vs_torch']:.2f}x | {r['max_rel_err']:.1e} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="digits-cnn,ds-cnn,resnet8,fc-autoencoder,mobilenet-v1-0.25",
                   help="comma-separated zoo models (default: all five)")
    p.add_argument("--batch", type=int, default=32, help="batch size of the training step (default: 32)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for Kiln and PyTorch (default: all cores)")
    p.add_argument("--iters", type=int, default=20, help="timed steps per model (default: 20)")
    p.add_argument("--markdown", metavar="PATH", help="also write the table to this file (nothing is written without it)")
    a = p.parse_args(argv)
    rows = []
    for m in a.models.split(","):
        r = bench_model(m.strip(), a.batch, a.threads, a.iters)
        print(f"{r['model']}: kiln {r['kiln_ms']:.2f} ms, torch {r['torch_ms']:.2f} ms, numpy {r['numpy_ms']:.1f} ms, "
              f"err {r['max_rel_err']:.1e}, build {r['build_s']} s{' (cached)' if r['cached'] else ''}", flush=True)
        rows.append(r)
    import torch
    machine = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; "
               f"torch {torch.__version__}")
    out = table(rows) + f"\n\nMachine: {machine}.\n"
    print(out)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(out)
    return rows


if __name__ == "__main__":
    main()
