"""Module API and layers (re-exported from kiln.frontend.module)."""
from kiln.frontend.module import (AvgPool2d, BatchNorm2d, Buffer, Conv2d, Dropout, Flatten,  # noqa: F401
                                  GlobalAvgPool, Linear, MaxPool2d, Module, Parameter, ReLU, ReLU6,
                                  Sequential, manual_seed)
