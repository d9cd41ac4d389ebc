"""The frameworks a model came from, run as oracles for imported models: onnxruntime for a
``.onnx``, torch itself for a ``.pt2`` (both optional: a missing one is a named error)."""
from __future__ import annotations

import os

import numpy as np

from kiln.frontend import run
from kiln.frontend.errors import KilnError


def oracle_name(path):
    ext = os.path.splitext(os.fspath(path))[1].lower()
    return {".onnx": "onnxruntime", ".pt2": "torch"}.get(ext)


def run_oracle(path, graph, samples):
    """[(outputs...)] of the source model of ``graph`` on ``samples`` (tuples of input arrays)."""
    kind = oracle_name(path)
    if kind == "onnxruntime":
        return _run_onnxruntime(path, graph, samples)
    if kind == "torch":
        return _run_torch(path, samples)
    raise KilnError(f"{path}: no framework oracle for this kind of model (.onnx: onnxruntime, .pt2: torch)")


def _run_onnxruntime(path, graph, samples):
    try:
        import onnxruntime as ort
    except ImportError:
        raise KilnError("checking against onnxruntime needs it: pip install 'kiln-ml[onnx]'") from None
    sess = ort.InferenceSession(os.fspath(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    return [tuple(np.asarray(o) for o in sess.run(None, dict(zip(names, xs)))) for xs in samples]


def _run_torch(path, samples):
    from kiln.frontend.torch_import import torch_module
    torch = torch_module()
    mod = torch.export.load(os.fspath(path)).module()
    outs = []
    with torch.no_grad():
        for xs in samples:
            y = mod(*[torch.from_numpy(np.ascontiguousarray(x)) for x in xs])
            flat = torch.utils._pytree.tree_leaves(y)
            outs.append(tuple(t.detach().numpy() for t in flat if isinstance(t, torch.Tensor)))
    return outs


def compare(graph, source_outs, samples):
    """Largest |difference| between Kiln's reference executor and the oracle, per output."""
    worst = None
    for xs, want in zip(samples, source_outs):
        got = run(graph, *xs)
        got = got if isinstance(got, (list, tuple)) else [got]
        if len(got) != len(want):
            raise KilnError(f"the imported graph has {len(got)} outputs, the source model {len(want)}")
        d = [float(np.max(np.abs(np.asarray(g, np.float64) - np.asarray(w, np.float64)))) if np.size(w) else 0.0
             for g, w in zip(got, want)]
        worst = d if worst is None else [max(a, c) for a, c in zip(worst, d)]
    return worst or []
