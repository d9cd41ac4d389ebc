"""Module API and layers (re-exported from kiln.frontend.module), GraphModule (a graph as a Module)
and eager execution."""
from kiln.frontend.graph_module import GraphModule  # noqa: F401
from kiln.frontend.module import (  # noqa: F401
                                  ELU,
                                  AvgPool2d,
                                  BatchNorm1d,
                                  BatchNorm2d,
                                  Buffer,
                                  Conv1d,
                                  Conv2d,
                                  Dropout,
                                  Embedding,
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
                                  Upsample,
                                  eager,
                                  manual_seed,
)
