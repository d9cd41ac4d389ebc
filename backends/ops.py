"""Importing this module registers every C lowering in the op registry (``deflower(op, "c")``)."""
from . import ops_elementwise, ops_misc, ops_nn  # noqa: F401
