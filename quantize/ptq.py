"""Post-training quantisation: a float Graph + calibration data -> an int8 Graph (TFLite int8
spec, see docs/int8_ir.md).

``ptq(graph, data, per_channel=True, method="minmax", int8_io=False)``:

1. :func:`~kiln.frontend.graph_passes.prepare`: fold constants and BatchNorm, fuse ReLU/ReLU6.
2. :func:`~kiln.quantize.calibrate.calibrate`: ranges of every activation.
3. :func:`~kiln.frontend.int8_convert.convert`: weights int8 symmetric (per output channel, or per tensor), biases int32 with
   scale ``s_in * s_w``, activations int8 asymmetric per tensor; ops whose output quantisation
   TFLite fixes get it (softmax/sigmoid 1/256 zp -128, tanh 1/128 zp 0; pooling, reshape and pad
   keep their input's). By default the graph takes and returns float (``quantize`` at the input,
   ``dequantize`` at the output); ``int8_io=True`` gives int8 input and output, as firmware wants.

``activations="int16"``: TFLite's 16x8 quantisation (int16 symmetric activations, int8 weights,
int64 biases with scale ``s_in * s_w``); see docs/quantization.md.
"""
from __future__ import annotations

import numpy as np

from kiln.frontend.graph import Graph
from kiln.frontend.graph_passes import prepare
from kiln.frontend.int8_convert import QuantizationError, convert, quantize_bias, quantize_weights, quantize_weights_as  # noqa: F401

from .calibrate import calibrate


def ptq(graph: Graph, calibration_data, per_channel=True, method="minmax", int8_io=False, percentile=99.99,
        batch_size=64, activations="int8") -> Graph:
    """Post-training quantisation of a float graph to int8 (see the module docstring);
    ``activations="int16"`` gives TFLite's 16x8 scheme (int16 activations, int8 weights, int64 bias);
    a dict {node name: "int8" | "int16"} (key "*": the default) mixes them per layer, with
    requantising QUANTIZE nodes where the type changes. Node names are the prepared graph's
    (after BatchNorm folding and activation fusion, which keep the conv/dense names)."""
    kinds = set(activations.values()) if isinstance(activations, dict) else {activations}
    pg = prepare(graph)
    ranges = calibrate(pg, calibration_data, method=method, percentile=percentile, batch_size=batch_size,
                       activations="int16" if kinds == {"int16"} else "int8")
    out = convert(pg, ranges, per_channel=per_channel, int8_io=int8_io, activations=activations)
    first = (next(iter(calibration_data.values())) if isinstance(calibration_data, dict) else
             calibration_data[0] if isinstance(calibration_data, (list, tuple)) and len(graph.inputs) > 1
             else calibration_data)
    out.meta.update(calibration=method, calibration_samples=int(len(np.asarray(first))))
    return out
