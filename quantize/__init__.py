"""Kiln's quantisation (TFLite int8 semantics; see docs/quantization.md and docs/int8_ir.md).

- The int8 reference itself lives with the ops (``int8_ref`` of each op in kiln.frontend.ops,
  the TFLite/gemmlowp primitives in kiln.frontend.fixedpoint; the ops ``quantize``,
  ``dequantize``, ``fake_quant`` in kiln.frontend.ops.quant): a loaded int8 graph runs
  without this package. This package turns float graphs into int8 ones:
- ``ptq(graph, calibration_data, per_channel=True, method="minmax"|"percentile"|"mse", int8_io=False)``
- ``qat(graph, train, test, ...)``: fake-quantised fine-tuning with kiln.training, then conversion.
- ``export_tflite(graph, path=None)``; .tflite import is ``kiln.frontend.tflite_import.load_tflite``.
- ``per_tensor(type, what, op)``, ``channel_params(type, n, op)``: a value's quantisation
  parameters as the int8 rules read them (the backends derive their constants with them).
"""
from kiln.frontend import fixedpoint  # noqa: F401  (kiln.quantize.fixedpoint, as before)
from kiln.frontend.fixedpoint import multiply_by_quantized_multiplier, quantize_multiplier  # noqa: F401
from kiln.frontend.graph_passes import fold_batchnorm, fuse_activations, prepare, with_batch  # noqa: F401
from kiln.frontend.ops.int8util import channel_params, per_tensor  # noqa: F401

from .calibrate import calibrate, qparams_from_range  # noqa: F401
from .ptq import QuantizationError, convert, ptq  # noqa: F401
from .qat import FakeQuantModule, QATResult, qat  # noqa: F401
from .tflite_export import ExportError, export_tflite  # noqa: F401
