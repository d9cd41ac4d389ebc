"""Kiln's frontend: the typed graph IR, the op registry, tracing, Modules, serialisation and the
NumPy reference executor."""
from . import (
                     functional,
                     ops,  # noqa: F401  (fills the registry)
)
from .errors import (
                     GraphError,
                     KilnError,
                     LimitError,
                     NumericsError,
                     OutputError,
                     SerializationError,
                     ShapeError,
                     TraceError,
                     UsageError,
)
from .executor import RunStats, run, run_updates
from .graph import Graph, Node
from .graph_module import GraphModule
from .limits import LIMITS, limits, set_limits
from .loader import SEMANTICS, load_model, semantics_of, with_semantics  # noqa: F401
from .module import (
                     ELU,
                     GRU,
                     LSTM,
                     SVDF,
                     AvgPool2d,
                     BatchNorm1d,
                     BatchNorm2d,
                     Buffer,
                     Conv1d,
                     Conv2d,
                     Dropout,
                     Flatten,
                     GlobalAvgPool,
                     Hardswish,
                     LeakyReLU,
                     Linear,
                     MaxPool2d,
                     Module,
                     Parameter,
                     PReLU,
                     ReLU,
                     ReLU6,
                     Sequential,
                     eager,
                     manual_seed,
)
from .registry import OPS, OpDef, get_op
from .serialize import load, save
from .tensor import Tensor, constant
from .trace import trace
from .types import QParams, TensorType

__all__ = [n for n in dir() if not n.startswith("_")]
