""".tflite import: structure, layouts and named errors."""
import os

import numpy as np
import pytest

from kiln.frontend import KilnError
from kiln.frontend.tflite_import import TFLiteImportError, load_tflite


def test_imports_kws_layouts(shared_models):
    g = load_tflite(os.path.join(shared_models, "kws_ref_model.tflite"))
    ops = [n.op for n in g.nodes]
    assert ops.count("conv2d") == 9 and ops.count("dense") == 1 and ops[-1] == "softmax"
    dw = [n for n in g.nodes if n.op == "conv2d" and n.attrs["groups"] > 1]
    assert len(dw) == 4
    w = g.types[dw[0].inputs[1]]
    assert w.shape == (64, 3, 3, 1) and w.quant.axis == 0 and len(w.quant.scale) == 64
    assert g.types[g.inputs[0]].quant.zero_point == (83,)
    assert g.types[g.outputs[0]].quant.scale == (0.00390625,)


def test_rejects_non_tflite_and_truncated(tmp_path):
    with pytest.raises(TFLiteImportError, match="not a TFLite model"):
        load_tflite(b"\x10\x00\x00\x00XXXX" + b"\x00" * 64)
    with pytest.raises(TFLiteImportError, match="too short"):
        load_tflite(b"\x10\x00")
    with pytest.raises(KilnError, match="cannot read"):
        load_tflite(tmp_path / "missing.tflite")
