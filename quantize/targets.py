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


def run_reference(model_path, inputs, options=None):
    from kiln.frontend import run
    g = load_model(model_path)
    outs = []
    for x in inputs:
        x = np.asarray(x)
        if len(g.inputs) != 1:
            raise KilnError(f"{model_path}: golden pairs feed one input, the model has {len(g.inputs)}")
        r = run(g, x)
        outs.append(r[0] if len(r) == 1 else r)
    return outs


register_target(Target("reference", run_reference, exact=True, atol=1e-5,
                       description="Kiln's NumPy reference executor (TFLite-exact int8 rules)"))
