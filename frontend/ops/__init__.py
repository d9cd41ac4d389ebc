"""Op definitions: importing this package fills the registry. ``norm_axes`` normalises an op's
``axes`` attribute (the int8 rules and backends read it the same way)."""
from . import (  # noqa: F401
               activations,
               batch_matmul,
               elementwise,
               elementwise_int8,
               elementwise_tflite,
               l2pool,
               nn,
               quant,
               recurrent,
               recurrent_tflite,
               reduce_shape,
               transpose_conv,
)
from ._util import norm_axes  # noqa: F401
