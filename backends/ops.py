"""Importing this module registers the C backend's overrides in the op registry (``deflower(op, "c")``:
int8 and DSP kernels; everything else is lowered with the op's TE compute, ``lower.lower_te``)."""
from . import (  # noqa: F401
    ops_bool,
    ops_dense,
    ops_detection,
    ops_elementwise,
    ops_helium,
    ops_int16,
    ops_linalg,
    ops_misc,
    ops_nn,
    ops_recurrent,
    ops_recurrent_int16,
    ops_shape,
    ops_svdf,
)
