"""Verify targets of the server backends (registered when imported; kiln/targets.py lists this
module in PROVIDERS):

  host-llvm   float Kiln graph (.json) compiled with TVM's LLVM target for this CPU
  cuda        float Kiln graph (.json) or a CUDA package folder, run with CuPy/NVRTC on a GPU
  cuda-plan   the CUDA package's launch plan executed on the CPU (plan interpreter): checks the
              arena plan, offsets and step order without a GPU

Each runner is ``runner(model_path, inputs, options) -> outputs`` with one output per input (the
graph's first output; golden pairs feed the graph's single input). Options: ``arch`` (default
sm_90), ``dtype`` (float32 | float16 | bfloat16), ``package`` (where to write the package).
"""
from __future__ import annotations

import os
import tempfile

import numpy as np

from kiln.frontend import load_model
from kiln.frontend.errors import KilnError
from kiln.targets import Target, register_target


def _load_graph(path):
    g = load_model(path)
    if any(t.quant is not None for t in g.types.values()):
        raise KilnError(f"{path}: a quantised model; the server targets run float models (int8 models run on "
                        f"the C backend: --target host or a board)")
    return g


def _single_input(graph, where):
    if len(graph.inputs) != 1:
        raise KilnError(f"{where}: graph {graph.name!r} has {len(graph.inputs)} inputs {graph.inputs}; golden "
                        f"pairs feed exactly one")


def run_host_llvm(model_path, inputs, options):
    from . import llvm_host
    g = _load_graph(model_path)
    _single_input(g, "host-llvm")
    cg = llvm_host.compile(g)
    want = g.types[g.inputs[0]].shape
    return [cg(np.asarray(x, np.float32).reshape(want))[0] for x in inputs]


def _package(model_path, options):
    from . import cuda
    if os.path.isdir(model_path):
        return model_path
    g = _load_graph(model_path)
    _single_input(g, "cuda")
    out = options.get("package") or tempfile.mkdtemp(prefix="kiln-cuda-")
    return cuda.compile(g, out, arch=options.get("arch", "sm_90"), dtype=options.get("dtype", "float32"))


def run_cuda(model_path, inputs, options):
    from .cuda_runner import CudaRunner
    pkg = _package(model_path, options)
    r = CudaRunner(pkg)
    want = r.m["inputs"][0]["shape"]
    return [r(np.asarray(x, np.float32).reshape(want))[0] for x in inputs]


def run_cuda_plan(model_path, inputs, options):
    from . import cuda
    pkg = _package(model_path, options)
    want = cuda.load_manifest(pkg)["inputs"][0]["shape"]
    return [cuda.interpret_plan(pkg, [np.asarray(x, np.float32).reshape(want)])[0] for x in inputs]


register_target(Target("host-llvm", run_host_llvm, exact=False, atol=1e-5,
                       description="float graph compiled by TVM (LLVM) for this CPU"))
register_target(Target("cuda", run_cuda, exact=False, atol=1e-4,
                       description="CUDA package (TVM-generated .cu + launch plan) run with CuPy/NVRTC"))
register_target(Target("cuda-plan", run_cuda_plan, exact=False, atol=1e-5,
                       description="CUDA package's launch plan executed on the CPU (no GPU needed)"))
