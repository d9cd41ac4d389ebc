"""The ``reference`` verification target: Kiln's NumPy executor with the TFLite-exact int8 rules.

``kiln verify MODEL --golden G.npz --target reference`` runs MODEL (a .tflite file or a Kiln graph
.json) on every golden input and compares bit for bit (int outputs) or within atol (float)."""
from __future__ import annotations

import os

import numpy as np

from kiln.frontend.errors import KilnError
from kiln.targets import Target, register_target


def load_model(path):
    """A Graph from a .tflite file or a Kiln graph (.json + .npz)."""
    from kiln.frontend import load
    from kiln.frontend.tflite_import import load_tflite
    from . import ops  # noqa: F401  (int8 rules and quantize/dequantize must be registered before load)
    p = os.fspath(path)
    if os.path.isdir(p):
        raise KilnError(f"{p}: the reference target runs a model file (.tflite or graph .json), "
                        f"not a compiled package folder")
    if p.endswith(".tflite"):
        return load_tflite(p)
    if p.endswith(".json") or os.path.exists(p + ".json"):
        return load(p)
    raise KilnError(f"{p}: unknown model format (expected .tflite or a Kiln graph .json)")


def run_reference(model_path, samples, options=None):
    """One tuple of outputs per sample (a tuple of input arrays)."""
    from kiln.frontend import run
    g = load_model(model_path) if isinstance(model_path, (str, os.PathLike)) else model_path
    outs = []
    for xs in samples:
        if len(xs) != len(g.inputs):
            raise KilnError(f"{model_path}: a sample has {len(xs)} inputs, the model takes {len(g.inputs)} "
                            f"({', '.join(g.inputs)})")
        outs.append(tuple(run(g, *[np.asarray(x).reshape(g.types[i].shape) for x, i in zip(xs, g.inputs)])))
    return outs


register_target(Target("reference", run_reference, exact=True, atol=1e-5, multi_io=True,
                       description="Kiln's NumPy reference executor (TFLite-exact int8 rules)"))
