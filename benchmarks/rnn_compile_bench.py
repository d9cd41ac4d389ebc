"""C backend on a long unrolled recurrent model: compile time per pipeline stage, package size and
the C compiler's time.

The model is Kiln's nn.GRU(8, 32) over T time steps (unrolled the way the TFLite converter
writes a Keras GRU: per step two FULLY_CONNECTED, SPLIT, ADD, LOGISTIC, MUL, SUB, TANH), float or
int8 (``ptq`` on 8 random sequences). Times are CPU seconds (this process for the stages, the
compiler's for gcc), so they hold on a loaded machine; one JSON object per line.

    .venv/bin/python benchmarks/rnn_compile_bench.py --steps 200 --kind int8 --target host
    .venv/bin/python benchmarks/rnn_compile_bench.py --steps 200 --kind int8 --target cortex-m4

``--target host`` then builds the package as the host library does (backends/host.py: gcc -O2
-shared); a Cortex-M target compiles kernels.c and model.c with arm-none-eabi-gcc -O2 as
``kiln compile`` measures code size (pipeline.code_size).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import tempfile
import time

import numpy as np


def _children_cpu():
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


def bench(steps, kind, target, out):
    import kiln.frontend as kf
    from kiln.backends import cpus, pipeline
    from kiln.backends.host import CFLAGS
    from kiln.quantize import ptq
    kf.manual_seed(0)
    g = kf.trace(kf.GRU(8, 32), (1, steps, 8))
    if kind == "int8":
        g = ptq(g, np.random.default_rng(1).standard_normal((8, steps, 8)).astype(np.float32), int8_io=True)
    r = {"steps": steps, "kind": kind, "target": target, "nodes": len(g.nodes), "stages": {}}
    st = pipeline.CompileState(source=g, target=cpus.get(target, "size"), out_dir=out, plot=False, measure=False)
    os.makedirs(out, exist_ok=True)
    for p in pipeline.PIPELINE:
        c0 = time.process_time()
        p(st)
        r["stages"][p.__name__] = round(time.process_time() - c0, 2)
    r["compile_cpu_s"] = round(sum(r["stages"].values()), 1)
    r["commands"], r["kernels"] = len(st.commands), len(st.kernels)
    r["bytes"] = {f: os.path.getsize(os.path.join(out, f)) for f in ("kernels.c", "model.c")}
    c0 = _children_cpu()
    if st.target.is_host:
        subprocess.run(["gcc", *CFLAGS, "-I", out, os.path.join(out, "kernels.c"), os.path.join(out, "model.c"),
                        "-o", os.path.join(out, "model.so"), "-lm"], check=True)
        r["library_bytes"] = os.path.getsize(os.path.join(out, "model.so"))
    else:
        r["sizes"] = pipeline.code_size(out, st.target)
    r["gcc_cpu_s"] = round(_children_cpu() - c0, 1)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--kind", choices=["float", "int8"], default="int8")
    ap.add_argument("--target", default="host", help="host or a C target (cortex-m4: mps2-an386)")
    ap.add_argument("-o", "--out", help="package folder (default: a temporary one)")
    a = ap.parse_args()
    out = a.out or tempfile.mkdtemp(prefix="kiln_rnn_bench_")
    print(json.dumps(bench(a.steps, a.kind, a.target, out)), flush=True)


if __name__ == "__main__":
    main()
