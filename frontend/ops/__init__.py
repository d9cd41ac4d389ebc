"""Op definitions: importing this package fills the registry."""
from . import elementwise, nn, reduce_shape  # noqa: F401
