"""The ``reference`` verification target: Kiln's NumPy executor with the TFLite-exact int8 rules.

``kiln verify MODEL --golden G.npz --target reference`` runs MODEL (a .tflite file or a Kiln graph
.json) on every golden input and compares bit for bit (int outputs) or within atol (float)."""
from __future__ import annotations


import numpy as np

from kiln.frontend import load_model
from kiln.frontend.errors import KilnError
from kiln.targets import Target, register_target


def run_reference(model_path, samples, options=None):
    """One tuple of outputs per sample (a tuple of input arrays)."""
    from kiln.frontend import run
    g = load_model(model_path)
    outs = []
    for xs in samples:
        if len(xs) != len(g.inputs):
            raise KilnError(f"{model_path}: a sample has {len(xs)} inputs, the model takes {len(g.inputs)} "
                            f"({', '.join(g.inputs)})")
        outs.append(tuple(run(g, *[np.asarray(x).reshape(g.types[i].shape) for x, i in zip(xs, g.inputs)])))
    return outs


register_target(Target("reference", run_reference, exact=True, atol=1e-5, multi_io=True,
                       description="Kiln's NumPy reference executor (TFLite-exact int8 rules)"))
