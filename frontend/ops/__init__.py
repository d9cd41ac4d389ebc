"""Op definitions: importing this package fills the registry. ``norm_axes`` normalises an op's
``axes`` attribute (the int8 rules and backends read it the same way)."""
from . import (  # noqa: F401
    activations,
    argcum,
    batch_matmul,
    control,
    detection,
    dynamic,
    elementwise,
    elementwise_int8,
    elementwise_int16,
    elementwise_tflite,
    gather,
    l2norm,
    l2pool,
    movement,
    nn,
    quant,
    rearrange,
    recurrent,
    recurrent_tflite,
    reduce_shape,
    reductions,
    resize,
    svdf,
    transpose_conv,
)
from ._util import norm_axes  # noqa: F401
