"""Op definitions: importing this package fills the registry."""
from . import elementwise, nn, quant, reduce_shape  # noqa: F401
