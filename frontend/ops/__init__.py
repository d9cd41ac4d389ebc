"""Op definitions: importing this package fills the registry. ``norm_axes`` normalises an op's
``axes`` attribute (the int8 rules and backends read it the same way)."""
from . import activations, elementwise, elementwise_int8, elementwise_tflite, nn, quant, reduce_shape  # noqa: F401

from . import elementwise, nn, quant, recurrent, recurrent_tflite, reduce_shape  # noqa: F401  # noqa: F401,E402

from . import elementwise, nn, quant, recurrent, recurrent_tflite, reduce_shape  # noqa: F401

from . import elementwise, l2pool, nn, quant, recurrent, recurrent_tflite, reduce_shape  # noqa: F401

from . import batch_matmul, elementwise, l2pool, nn, quant, recurrent, recurrent_tflite, reduce_shape  # noqa: F401

from . import batch_matmul, elementwise, l2pool, nn, quant, recurrent, recurrent_tflite, reduce_shape, transpose_conv  # noqa: F401
from ._util import norm_axes  # noqa: F401
