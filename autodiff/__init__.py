"""Automatic differentiation as graph transformations."""
from .check import check_grads, to_float64
from .forward import hvp, jvp
from .remat import checkpoint
from .reverse import grad, prune, vjp

__all__ = ["grad", "vjp", "jvp", "hvp", "check_grads", "checkpoint", "prune", "to_float64"]
