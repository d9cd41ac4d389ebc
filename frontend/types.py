"""Tensor types: shape, dtype and optional quantisation parameters."""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from . import limits
from .errors import ShapeError

DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64", "bool")
FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")


def np_dtype(dtype: str):
    if dtype == "bfloat16":
        raise ShapeError("bfloat16 has no NumPy dtype; the NumPy reference runs float32/float64")
    return np.dtype(dtype)


def dtype_of(arr) -> str:
    d = np.asarray(arr).dtype
    name = d.name
    if name not in DTYPES:
        raise ShapeError(f"unsupported dtype {name}; Kiln supports {', '.join(DTYPES)}")
    return name


@dataclasses.dataclass(frozen=True)
class QParams:
    """Affine quantisation: real = scale * (q - zero_point). Per tensor (axis None) or per channel."""
    scale: tuple
    zero_point: tuple
    axis: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "scale", tuple(float(s) for s in np.atleast_1d(self.scale)))
        object.__setattr__(self, "zero_point", tuple(int(z) for z in np.atleast_1d(self.zero_point)))
        if len(self.scale) != len(self.zero_point):
            raise ShapeError(f"quantisation has {len(self.scale)} scales but {len(self.zero_point)} zero points")
        if self.axis is None and len(self.scale) != 1:
            raise ShapeError("per-tensor quantisation needs exactly one scale (set axis for per-channel)")

    @property
    def per_channel(self) -> bool:
        return self.axis is not None

    def to_json(self):
        return {"scale": list(self.scale), "zero_point": list(self.zero_point), "axis": self.axis}

    @classmethod
    def from_json(cls, d):
        return cls(tuple(d["scale"]), tuple(d["zero_point"]), d.get("axis"))


@dataclasses.dataclass(frozen=True)
class TensorType:
    shape: tuple
    dtype: str = "float32"
    quant: QParams | None = None

    def __post_init__(self):
        shape = tuple(int(s) for s in self.shape)
        if any(s < 0 for s in shape):
            raise ShapeError(f"negative dimension in shape {shape}")
        object.__setattr__(self, "shape", shape)
        if self.dtype not in DTYPES:
            raise ShapeError(f"unknown dtype {self.dtype!r}; expected one of {DTYPES}")
        limits.check("max_tensor_elements", self.size, f"tensor of shape {shape}")

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return math.prod(self.shape)

    @property
    def itemsize(self):
        return {"bfloat16": 2, "bool": 1}.get(self.dtype) or np.dtype(self.dtype).itemsize

    @property
    def nbytes(self):
        return self.size * self.itemsize

    @property
    def is_float(self):
        return self.dtype in FLOAT_DTYPES

    def with_shape(self, shape):
        return dataclasses.replace(self, shape=tuple(shape))

    def with_dtype(self, dtype, quant=None):
        return TensorType(self.shape, dtype, quant)

    def __str__(self):
        s = f"{self.dtype}[{','.join(map(str, self.shape))}]"
        if self.quant is not None:
            q = self.quant
            if q.per_channel:
                s += f"{{q axis={q.axis} x{len(q.scale)}}}"
            else:
                s += f"{{q s={q.scale[0]:.6g} zp={q.zero_point[0]}}}"
        return s

    def to_json(self):
        d = {"shape": list(self.shape), "dtype": self.dtype}
        if self.quant is not None:
            d["quant"] = self.quant.to_json()
        return d

    @classmethod
    def from_json(cls, d):
        q = d.get("quant")
        return cls(tuple(d["shape"]), d["dtype"], QParams.from_json(q) if q else None)

    @classmethod
    def of(cls, arr, quant=None):
        arr = np.asarray(arr)
        return cls(arr.shape, dtype_of(arr), quant)


def broadcast_shapes(*shapes, where=""):
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ShapeError(f"shapes {' and '.join(map(str, shapes))} do not broadcast (NumPy rules){where}") from None
