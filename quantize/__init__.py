"""Kiln's quantisation: TFLite-exact int8 reference rules (filled into the op registry), the
fixed-point primitives they use, and (below) PTQ, QAT and .tflite export.

Importing this package registers the ``quantize``/``dequantize``/``fake_quant`` ops and the
``int8_ref`` rule of every quantizable op."""
from . import fixedpoint  # noqa: F401
from . import ops  # noqa: F401  (registers quantize / dequantize / fake_quant)
from . import int8_elementwise, int8_linear, int8_shape  # noqa: F401  (fill the int8_ref rules)
from .fixedpoint import multiply_by_quantized_multiplier, quantize_multiplier  # noqa: F401
