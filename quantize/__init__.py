"""Kiln's quantisation (TFLite int8 semantics; see docs/quantization.md and docs/int8_ir.md).

- The int8 reference: ``int8_ref`` rules on the registry entries (filled when this package is
  imported), run by the frontend executor; ``fixedpoint`` holds the TFLite/gemmlowp primitives
  (``quantize_multiplier``, ``multiply_by_quantized_multiplier``, ...) that backends reuse.
- New ops: ``quantize``, ``dequantize``, ``fake_quant`` (QAT).
- ``ptq(graph, calibration_data, per_channel=True, method="minmax"|"percentile"|"mse", int8_io=False)``
- ``qat(graph, train, test, ...)``: fake-quantised fine-tuning with kiln.training, then conversion.
- ``export_tflite(graph, path=None)``; .tflite import is ``kiln.frontend.tflite_import.load_tflite``.
- ``per_tensor(type, what, op)``, ``channel_params(type, n, op)``: a value's quantisation
  parameters as the int8 rules read them (the backends derive their constants with them).
"""
from . import fixedpoint  # noqa: F401
from ._qutil import channel_params, per_tensor  # noqa: F401
from . import ops  # noqa: F401  (registers quantize / dequantize / fake_quant)
from . import int8_elementwise, int8_linear, int8_shape  # noqa: F401  (fill the int8_ref rules)
from .calibrate import calibrate, qparams_from_range  # noqa: F401
from .fixedpoint import multiply_by_quantized_multiplier, quantize_multiplier  # noqa: F401
from .graph_passes import fold_batchnorm, fuse_activations, prepare, with_batch  # noqa: F401
from .ptq import QuantizationError, convert, ptq  # noqa: F401
from .qat import FakeQuantModule, QATResult, qat  # noqa: F401
from .tflite_export import ExportError, export_tflite  # noqa: F401
