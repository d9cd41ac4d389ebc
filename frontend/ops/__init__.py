"""Op definitions: importing this package fills the registry. ``norm_axes`` normalises an op's
``axes`` attribute (the int8 rules and backends read it the same way)."""
from . import (  # noqa: F401
    activations,
    argcum,
    elementwise,
    elementwise_int8,
    elementwise_tflite,
    gather,
    l2norm,
    movement,
    nn,
    quant,
    rearrange,
    reduce_shape,
    reductions,
    resize,
)
from ._util import norm_axes  # noqa: F401
