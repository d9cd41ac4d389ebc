"""Module / Parameter / Buffer API and the standard layers.

Parameters, buffers and sub-modules are discovered through attributes, including lists, tuples and
dicts of modules; ``named_parameters()`` yields dotted names (``features.0.weight``) which are also
the names of the parameters in a traced Graph. Layers use Kiln's layouts: NHWC activations, OHWI
conv weights, [out, in] dense weights.
"""
from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np

from . import functional as F
from .errors import KilnError
from .tensor import Tensor, current_graph

_rng = np.random.default_rng(0)


def manual_seed(seed):
    """Seed the generator used to initialise new layers and restart the Dropout salt counter, so
    the same seed builds the same model (weights and dropout masks) again in one process."""
    global _rng
    _rng = np.random.default_rng(seed)
    Dropout._count = 0


def default_rng():
    return _rng


class Parameter:
    """A trainable tensor. ``data`` is a NumPy array."""
    __array_ufunc__ = None      # ndarray <op> Parameter defers to Parameter's operators

    def __init__(self, data, dtype="float32"):
        self.data = np.asarray(data, dtype=dtype)

    @property
    def shape(self):
        return self.data.shape

    @property
    def dtype(self):
        return self.data.dtype.name

    def __repr__(self):
        return f"Parameter({self.dtype}{list(self.shape)})"

    def _t(self):
        if F.eager_active():          # kiln.eager(): the array itself
            return self.data
        from .tensor import as_tensor
        return as_tensor(self)

    # a Parameter used in an expression during tracing behaves like its Tensor
    def __add__(self, o): return self._t() + o
    def __radd__(self, o): return o + self._t()
    def __sub__(self, o): return self._t() - o
    def __rsub__(self, o): return o - self._t()
    def __mul__(self, o): return self._t() * o
    def __rmul__(self, o): return o * self._t()
    def __truediv__(self, o): return self._t() / o
    def __rtruediv__(self, o): return o / self._t()
    def __abs__(self): return abs(self._t())
    def __matmul__(self, o): return self._t() @ o
    def __rmatmul__(self, o): return o @ self._t()
    def __neg__(self): return -self._t()
    def __pow__(self, p): return self._t() ** p
    def __getitem__(self, i): return self._t()[i]
    @property
    def T(self): return self._t().T
    def reshape(self, *s): return self._t().reshape(*s)
    def sum(self, *a, **k): return self._t().sum(*a, **k)


class Buffer(Parameter):
    """A non-trainable tensor kept with the module (e.g. BatchNorm running statistics)."""

    def __repr__(self):
        return f"Buffer({self.dtype}{list(self.shape)})"


def _children(obj, prefix):
    if isinstance(obj, (Module, Parameter)):
        yield prefix, obj
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _children(v, f"{prefix}.{i}")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _children(v, f"{prefix}.{k}")


class Module:
    """Base class of every layer and model: subclass it, set layers and Parameters as attributes in
    ``__init__`` (lists, tuples and dicts of them count too) and define ``forward``; ``module(x)``
    calls ``forward(x)``, and ``kiln.trace(module, *example_inputs)`` turns it into a Graph."""
    training = True

    def __call__(self, *args, **kw):
        return self.forward(*args, **kw)

    def forward(self, *args, **kw):
        raise NotImplementedError(f"{type(self).__name__}.forward is not defined")

    def _direct(self):
        for k, v in vars(self).items():
            if k.startswith("_"):
                continue
            yield from _children(v, k)

    def named_modules(self, prefix="", _memo=None):
        """(dotted name, module) pairs, this module first; a module reachable twice is listed once."""
        memo = set() if _memo is None else _memo
        if id(self) in memo:
            return
        memo.add(id(self))
        yield prefix, self
        for name, v in self._direct():
            if isinstance(v, Module):
                yield from v.named_modules(f"{prefix}.{name}" if prefix else name, memo)

    def modules(self):
        """Every module in the tree, this one first."""
        return [m for _, m in self.named_modules()]

    def _named_tensors(self, kind):
        seen = set()
        for mname, m in self.named_modules():
            for name, v in m._direct():
                if type(v) is kind and id(v) not in seen:
                    seen.add(id(v))
                    yield (f"{mname}.{name}" if mname else name), v

    def named_parameters(self):
        """(dotted name, Parameter) pairs (``features.0.weight``): the names the parameters have in
        a traced Graph."""
        return list(self._named_tensors(Parameter))

    def parameters(self):
        """Every Parameter, each once."""
        return [p for _, p in self.named_parameters()]

    def named_buffers(self):
        """(dotted name, Buffer) pairs (e.g. BatchNorm running statistics)."""
        return list(self._named_tensors(Buffer))

    def train(self, mode=True):
        """Set training mode (Dropout active, BatchNorm on batch statistics) on every module;
        returns self."""
        for m in self.modules():
            m.training = mode
        return self

    def eval(self):
        """Set evaluation mode on every module (``train(False)``); returns self."""
        return self.train(False)

    def to(self, dtype):
        """Cast every float parameter and buffer to ``dtype`` in place (e.g. 'float64' for gradient
        checks); returns self."""
        for _, p in self.named_parameters() + self.named_buffers():
            if p.data.dtype.kind == "f":
                p.data = p.data.astype(dtype)
        return self

    def state_dict(self):
        """{dotted name: copy of the array} of every parameter and buffer."""
        d = OrderedDict()
        for k, p in self.named_parameters() + self.named_buffers():
            d[k] = p.data.copy()
        return d

    def load_state_dict(self, state, strict=True):
        """Copy arrays from ``state`` into the parameters and buffers of the same names. A key
        of the wrong shape always raises KilnError; missing or unexpected keys raise it when
        ``strict``. Returns {"missing": [...], "unexpected": [...]}."""
        own = dict(self.named_parameters() + self.named_buffers())
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own]
        misshaped = [f"{k}: expected {own[k].shape}, got {tuple(np.shape(state[k]))}"
                     for k in own if k in state and tuple(np.shape(state[k])) != own[k].shape]
        if misshaped or (strict and (missing or unexpected)):
            parts = []
            if missing:
                parts.append(f"missing keys: {missing}")
            if unexpected:
                parts.append(f"unexpected keys: {unexpected}")
            if misshaped:
                parts.append(f"mis-shaped keys: {misshaped}")
            raise KilnError(f"load_state_dict for {type(self).__name__} failed: " + "; ".join(parts))
        for k, p in own.items():
            if k in state:
                p.data = np.asarray(state[k], dtype=p.data.dtype).copy()
        return {"missing": missing, "unexpected": unexpected}

    def __repr__(self):
        kids = [(n, v) for n, v in self._direct() if isinstance(v, Module)]
        if not kids:
            return f"{type(self).__name__}({self.extra_repr()})"
        body = "\n".join(f"  ({n}): " + repr(m).replace("\n", "\n  ") for n, m in kids)
        return f"{type(self).__name__}(\n{body}\n)"

    def extra_repr(self):
        """What ``repr`` shows inside the parentheses of a leaf module (override it)."""
        return ""


def _uniform(shape, bound):
    return _rng.uniform(-bound, bound, size=shape).astype(np.float32)


class Linear(Module):
    """Fully connected layer ``x @ weight.T + bias`` on the last axis; weight is [out, in];
    ``activation``: none, relu or relu6 (fused)."""

    def __init__(self, in_features, out_features, bias=True, activation="none"):
        bound = 1.0 / math.sqrt(in_features)
        self.weight = Parameter(_uniform((out_features, in_features), bound))
        self.bias = Parameter(_uniform((out_features,), bound)) if bias else None
        self.activation = activation
        self.in_features, self.out_features = in_features, out_features

    def forward(self, x):
        return F.dense(x, self.weight, self.bias, activation=self.activation)

    def extra_repr(self):
        return f"{self.in_features}, {self.out_features}"


class Conv2d(Module):
    """NHWC convolution; weight is OHWI [out, kh, kw, in / groups]."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding="valid", dilation=1,
                 groups=1, bias=True, activation="none"):
        kh, kw = (kernel_size, kernel_size) if isinstance(kernel_size, int) else kernel_size
        if in_channels % groups or out_channels % groups:
            raise KilnError(f"Conv2d: channels {in_channels}->{out_channels} not divisible by groups={groups}")
        fan_in = (in_channels // groups) * kh * kw
        bound = 1.0 / math.sqrt(fan_in)
        self.weight = Parameter(_uniform((out_channels, kh, kw, in_channels // groups), bound))
        self.bias = Parameter(_uniform((out_channels,), bound)) if bias else None
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        self.activation = activation
        self.cfg = (in_channels, out_channels, (kh, kw))

    def forward(self, x):
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups,
                        activation=self.activation)

    def extra_repr(self):
        i, o, k = self.cfg
        return f"{i}, {o}, kernel={k}, stride={self.stride}, padding={self.padding}, groups={self.groups}"


class Conv1d(Module):
    """1-D convolution over [N, L, C] (channels last); weight is [out, kernel, in / groups].
    ``padding``: an int (the same on both ends, as PyTorch's), (lo, hi), 'same' or 'valid'."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, activation="none"):
        if in_channels % groups or out_channels % groups:
            raise KilnError(f"Conv1d: channels {in_channels}->{out_channels} not divisible by groups={groups}")
        bound = 1.0 / math.sqrt((in_channels // groups) * kernel_size)
        self.weight = Parameter(_uniform((out_channels, kernel_size, in_channels // groups), bound))
        self.bias = Parameter(_uniform((out_channels,), bound)) if bias else None
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        self.activation = activation
        self.cfg = (in_channels, out_channels, kernel_size)

    def forward(self, x):
        return F.conv1d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups,
                        activation=self.activation)

    def extra_repr(self):
        i, o, k = self.cfg
        return f"{i}, {o}, kernel={k}, stride={self.stride}, padding={self.padding}, groups={self.groups}"


def record_update(buffer: Buffer, value: Tensor):
    """Record, in the graph being traced, that ``buffer`` takes ``value`` after this step."""
    from .tensor import as_tensor
    b = as_tensor(buffer)
    value.graph.updates[b.name] = value.name


class BatchNorm2d(Module):
    """NHWC batch normalisation over (N, H, W). Train mode normalises with batch statistics (biased
    variance) and updates running statistics with momentum (unbiased variance), as PyTorch does;
    eval mode uses the running statistics."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1):
        self.weight = Parameter(np.ones(num_features, np.float32))
        self.bias = Parameter(np.zeros(num_features, np.float32))
        self.running_mean = Buffer(np.zeros(num_features, np.float32))
        self.running_var = Buffer(np.ones(num_features, np.float32))
        self.eps, self.momentum, self.num_features = eps, momentum, num_features

    def forward(self, x):
        axes = list(range(x.ndim - 1))
        if self.training:
            n = math.prod(x.shape[:-1])
            mean = F.mean(x, axes)
            xc = x - mean
            var = F.mean(xc * xc, axes)
            if current_graph() is not None:
                m = self.momentum
                record_update(self.running_mean, self.running_mean * (1.0 - m) + mean * m)
                record_update(self.running_var, self.running_var * (1.0 - m) + var * (m * n / max(n - 1, 1)))
            inv = 1.0 / F.sqrt(var + self.eps)
            return xc * (inv * self.weight) + self.bias
        inv = 1.0 / F.sqrt(self.running_var + self.eps)
        scale = inv * self.weight
        return x * scale + (self.bias - self.running_mean * scale)

    def extra_repr(self):
        return f"{self.num_features}"


class BatchNorm1d(BatchNorm2d):
    """Batch normalisation of [N, C] or [N, L, C] (channels last) over every axis but the last:
    the same statistics and updates as BatchNorm2d (and PyTorch's BatchNorm1d)."""


class ReLU(Module):
    """max(x, 0)."""

    def forward(self, x):
        return F.relu(x)


class ReLU6(Module):
    """min(max(x, 0), 6)."""

    def forward(self, x):
        return F.relu6(x)


class Dropout(Module):
    """Inverted dropout in train mode (identity in eval). The mask comes from the graph input
    ``dropout_key`` (an int64 scalar the training loop feeds each step) and a per-layer salt."""
    _count = 0

    def __init__(self, p=0.5):
        self.p = p
        Dropout._count += 1
        self.salt = Dropout._count

    def forward(self, x):
        if not self.training or self.p == 0:
            return x
        if F.eager_active():
            raise KilnError("Dropout in train mode needs the traced graph's dropout key: run eagerly in eval mode "
                            "(module.eval()), or trace")
        return F.dropout(x, dropout_key(x.graph), self.p, self.salt)


def dropout_key(graph):
    from .types import TensorType
    if "dropout_key" not in graph.types:
        graph.add_input("dropout_key", TensorType((), "int64"))
        graph.meta.setdefault("rng_inputs", []).append("dropout_key")
    return Tensor(graph, "dropout_key")


class AvgPool2d(Module):
    """NHWC average pooling (stride defaults to kernel_size; padding excluded from the count, as
    TFLite)."""

    def __init__(self, kernel_size, stride=None, padding="valid"):
        self.k, self.s, self.p = kernel_size, stride, padding

    def forward(self, x):
        return F.avg_pool2d(x, self.k, self.s, self.p)


class MaxPool2d(Module):
    """NHWC max pooling (stride defaults to kernel_size)."""

    def __init__(self, kernel_size, stride=None, padding="valid"):
        self.k, self.s, self.p = kernel_size, stride, padding

    def forward(self, x):
        return F.max_pool2d(x, self.k, self.s, self.p)


class GlobalAvgPool(Module):
    """NHWC -> NC: mean over H and W."""

    def forward(self, x):
        return F.mean(x, [1, 2])


def eager(module, *arrays):
    """``module(*arrays)`` run eagerly on NumPy arrays (``kiln.eager()``): every op computes at once
    with its NumPy reference, so intermediate values can be printed in ``forward``."""
    with F.eager():
        return module(*[np.asarray(a) for a in arrays])


class Flatten(Module):
    """[N, ...] -> [N, everything else]."""

    def forward(self, x):
        return F.reshape(x, (x.shape[0], -1))


class Sequential(Module):
    """Layers applied in order; ``seq[i]`` is the i-th layer, parameters are named ``i.name``."""

    def __init__(self, *layers):
        self.layers = list(layers)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x

    def __getitem__(self, i):
        return self.layers[i]

    def __len__(self):
        return len(self.layers)

    def _direct(self):
        for i, m in enumerate(self.layers):
            yield str(i), m


# ---- activations of TFLite's element-wise family (frontend/ops/activations.py) ----------------
class LeakyReLU(Module):
    """x if x > 0 else negative_slope * x (LEAKY_RELU)."""

    def __init__(self, negative_slope=0.01):
        self.negative_slope = float(negative_slope)

    def forward(self, x):
        return F.leaky_relu(x, self.negative_slope)


class Hardswish(Module):
    """x * relu6(x + 3) / 6 (HARD_SWISH)."""

    def forward(self, x):
        return F.hard_swish(x)


class ELU(Module):
    """x if x > 0 else exp(x) - 1 (ELU, alpha 1)."""

    def forward(self, x):
        return F.elu(x)


class PReLU(Module):
    """x if x >= 0 else weight * x, one learnable slope per channel (last axis) or one shared
    (``num_parameters=1``); PRELU in TFLite."""

    def __init__(self, num_parameters=1, init=0.25):
        self.weight = Parameter(np.full((num_parameters,), init, np.float32))

    def forward(self, x):
        return F.prelu(x, self.weight)

# ---- recurrent layers (frontend/ops/recurrent.py) ----------------------------------------------
def _torch_array(t):
    return np.asarray(t.detach().cpu().numpy(), np.float32)


class LSTM(Module):
    """One-layer LSTM over [N, T, input_size] (batch first) returning every step's hidden state
    [N, T, hidden_size]; the state starts at zero. One fused ``lstm`` node (exported as TFLite's
    UNIDIRECTIONAL_SEQUENCE_LSTM); its gradient is backpropagation through time. Parameters per
    gate in PyTorch's order (input, forget, cell, output): ``weight_ih.k`` [H, I], ``weight_hh.k``
    [H, H], ``bias.k`` [H] (PyTorch's ``b_ih + b_hh``). ``load_torch(torch_lstm)`` copies a
    one-layer unidirectional ``torch.nn.LSTM(batch_first=True)``. ``stateful=True``: a streaming
    LSTM whose hidden and cell states persist from one run to the next (graph states, reset by
    ``reset_state()``; TFLite's variable tensors), each run a window of T steps."""

    def __init__(self, input_size, hidden_size, cell_clip=0.0, stateful=False):
        bound = 1.0 / math.sqrt(hidden_size)
        self.weight_ih = [Parameter(_uniform((hidden_size, input_size), bound)) for _ in range(4)]
        self.weight_hh = [Parameter(_uniform((hidden_size, hidden_size), bound)) for _ in range(4)]
        self.bias = [Parameter(_uniform((hidden_size,), bound)) for _ in range(4)]
        self.input_size, self.hidden_size, self.cell_clip = input_size, hidden_size, cell_clip
        self.stateful = bool(stateful)

    def forward(self, x):
        if self.stateful:
            h0, c0 = (np.zeros((x.shape[0], self.hidden_size), np.float32) for _ in range(2))
            return F.lstm(x, self.weight_ih, self.weight_hh, self.bias, h0, c0, cell_clip=self.cell_clip,
                          stateful=True)
        zeros = F.constant(np.zeros((x.shape[0], self.hidden_size), np.float32))
        return F.lstm(x, self.weight_ih, self.weight_hh, self.bias, zeros, zeros, cell_clip=self.cell_clip)

    def load_torch(self, m):
        if m.num_layers != 1 or m.bidirectional or not m.batch_first or m.proj_size:
            raise KilnError("LSTM.load_torch takes a one-layer unidirectional torch.nn.LSTM(batch_first=True) "
                            "without projection")
        H = self.hidden_size
        w_ih, w_hh = _torch_array(m.weight_ih_l0), _torch_array(m.weight_hh_l0)
        b = _torch_array(m.bias_ih_l0) + _torch_array(m.bias_hh_l0) if m.bias else np.zeros(4 * H, np.float32)
        for k in range(4):
            self.weight_ih[k].data = w_ih[k * H:(k + 1) * H].copy()
            self.weight_hh[k].data = w_hh[k * H:(k + 1) * H].copy()
            self.bias[k].data = b[k * H:(k + 1) * H].copy()
        return self

    def extra_repr(self):
        return f"{self.input_size}, {self.hidden_size}" + (", stateful=True" if self.stateful else "")


class GRU(Module):
    """One-layer GRU over [N, T, input_size] (batch first) returning [N, T, hidden_size] from a
    zero state: ``z = sigmoid(W_iz x + b_iz + W_hz h + b_hz)``, ``r`` likewise, ``n = tanh(W_in x +
    b_in + r * (W_hn h + b_hn))``, ``h' = z * h + (1 - z) * n`` (PyTorch's GRU, Keras's with
    ``reset_after=True``). Unrolled over time the way the TFLite converter writes a Keras GRU: per
    step one FULLY_CONNECTED of the input with the stacked 3H kernel and one of the state with the
    stacked recurrent kernel, each SPLIT into three gates, then ADD, LOGISTIC, MUL, SUB and TANH;
    float or int8. Parameters are stacked in Keras's gate order z, r, n: ``weight_ih`` [3H, I],
    ``weight_hh`` [3H, H], ``bias_ih``, ``bias_hh`` [3H]. ``load_torch`` (gates r, z, n) and
    ``load_keras`` copy trained weights."""

    def __init__(self, input_size, hidden_size):
        bound = 1.0 / math.sqrt(hidden_size)
        # drawn per gate r, z, n (as before the gates were stacked: seeded models keep their weights)
        rzn = [[_uniform(shape, bound) for _ in range(3)] for shape in ((hidden_size, input_size),
               (hidden_size, hidden_size), (hidden_size,), (hidden_size,))]
        self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh = (
            Parameter(np.concatenate([r_z_n[1], r_z_n[0], r_z_n[2]])) for r_z_n in rzn)
        self.input_size, self.hidden_size = input_size, hidden_size

    def _gates(self, v):
        H = self.hidden_size
        if len(v.shape) == 1:
            return [F.slice(v, [k * H], [(k + 1) * H]) for k in range(3)]
        return [F.slice(v, [0, k * H], [v.shape[0], (k + 1) * H]) for k in range(3)]

    def _step(self, xt, h):
        # the recurrent product first, as the converter orders it (the zero state's is the bias)
        hz, hr, hn = self._gates(self.bias_hh if h is None else F.dense(h, self.weight_hh, self.bias_hh))
        xz, xr, xn = self._gates(F.dense(xt, self.weight_ih, self.bias_ih))
        z = F.sigmoid(xz + hz)
        zh = None if h is None else z * h
        keep = F.sub(1.0, z)
        r = F.sigmoid(xr + hr)
        new = keep * F.tanh(xn + r * hn)
        return new if zh is None else zh + new

    def forward(self, x):
        N, T, I = x.shape
        h, hs = None, []
        for t in range(T):
            h = self._step(F.reshape(x if T == 1 else F.slice(x, [0, t, 0], [N, t + 1, I]), [N, I]), h)
            hs.append(F.reshape(h, [N, 1, self.hidden_size]))
        return F.concat(hs, 1) if T > 1 else hs[0]

    def _load(self, w_ih, w_hh, b_ih, b_hh):
        H, I = self.hidden_size, self.input_size
        for p, a, shape in ((self.weight_ih, w_ih, (3 * H, I)), (self.weight_hh, w_hh, (3 * H, H)),
                            (self.bias_ih, b_ih, (3 * H,)), (self.bias_hh, b_hh, (3 * H,))):
            a = np.asarray(a, np.float32)
            if a.shape != shape:
                raise KilnError(f"GRU({I}, {H}): a weight of shape {list(a.shape)} where {list(shape)} is expected")
            p.data = a.copy()
        return self

    def load_torch(self, m):
        if m.num_layers != 1 or m.bidirectional or not m.batch_first or not m.bias:
            raise KilnError("GRU.load_torch takes a one-layer unidirectional torch.nn.GRU(batch_first=True, bias=True)")
        H = self.hidden_size
        zrn = np.r_[H:2 * H, 0:H, 2 * H:3 * H]          # PyTorch stacks r, z, n
        arrays = [_torch_array(getattr(m, n))[zrn] for n in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")]
        return self._load(*arrays)

    def load_keras(self, weights):
        """Copy a Keras ``GRU(reset_after=True)`` layer's ``get_weights()``: kernel [I, 3H],
        recurrent_kernel [H, 3H], bias [2, 3H] (input and recurrent biases; gates z, r, h)."""
        if len(weights) != 3 or np.shape(weights[2]) != (2, 3 * self.hidden_size):
            raise KilnError("GRU.load_keras takes the [kernel, recurrent_kernel, bias] of a Keras GRU with "
                            "reset_after=True (bias of shape [2, 3 * units])")
        kernel, rec, bias = (np.asarray(w, np.float32) for w in weights)
        return self._load(kernel.T, rec.T, bias[0], bias[1])

    def extra_repr(self):
        return f"{self.input_size}, {self.hidden_size}"

# ---- data movement (frontend/ops: resize.py, gather.py) ----------------------------------------------
class Upsample(Module):
    """Resize NHWC images to ``size`` (h, w) or by ``scale_factor``; ``mode`` 'nearest' or 'bilinear'.
    Bilinear follows PyTorch: ``align_corners=False`` samples at half-pixel centres (TFLite's
    half_pixel_centers), ``True`` aligns the corners. Exports as RESIZE_NEAREST_NEIGHBOR /
    RESIZE_BILINEAR."""

    def __init__(self, size=None, scale_factor=None, mode="nearest", align_corners=False):
        if (size is None) == (scale_factor is None):
            raise KilnError("Upsample: give exactly one of size and scale_factor")
        if mode not in ("nearest", "bilinear"):
            raise KilnError(f"Upsample: mode must be 'nearest' or 'bilinear', got {mode!r}")
        self.size, self.scale_factor, self.mode, self.align_corners = size, scale_factor, mode, bool(align_corners)

    def forward(self, x):
        if self.size is not None:
            size = (self.size, self.size) if isinstance(self.size, int) else tuple(self.size)
        else:
            sf = self.scale_factor if isinstance(self.scale_factor, (tuple, list)) else (self.scale_factor,) * 2
            size = (int(math.floor(x.shape[1] * sf[0])), int(math.floor(x.shape[2] * sf[1])))
        bilinear = self.mode == "bilinear"
        return F.resize(x, size, self.mode, align_corners=bilinear and self.align_corners,
                        half_pixel_centers=bilinear and not self.align_corners)

    def extra_repr(self):
        return f"size={self.size}, scale_factor={self.scale_factor}, mode={self.mode!r}"


class Embedding(Module):
    """Rows of a [num_embeddings, embedding_dim] table at int32 indices (TFLite GATHER)."""

    def __init__(self, num_embeddings, embedding_dim):
        self.weight = Parameter(_rng.standard_normal((num_embeddings, embedding_dim)).astype(np.float32))
        self.cfg = (num_embeddings, embedding_dim)

    def forward(self, ids):
        return F.gather(self.weight, ids, axis=0)

    def extra_repr(self):
        return f"{self.cfg[0]}, {self.cfg[1]}"


# ---- SVDF (frontend/ops/svdf.py) -----------------------------------------------------------------
class SVDF(Module):
    """TFLite's SVDF layer over x [N, input_size] -> [N, units], a stateful layer (what keyword
    spotters use): ``rank`` filters per unit, each a feature projection ``weights_feature`` [units *
    rank, input_size] whose last ``memory`` values (the state, kept between runs) are weighed by
    ``weights_time`` [units * rank, memory]; plus ``bias`` [units] and ``activation`` 'none' or
    'relu'. Exports as one SVDF operator; ``ptq`` quantises it to TFLite's integer SVDF (int8
    input, feature weights and output, int16 time weights and state, int32 bias)."""

    def __init__(self, input_size, units, memory, rank=1, activation="none"):
        if activation not in ("none", "relu"):
            raise KilnError(f"SVDF: activation must be 'none' or 'relu', got {activation!r}")
        F_ = units * rank
        self.weights_feature = Parameter(_uniform((F_, input_size), 1.0 / math.sqrt(input_size)))
        self.weights_time = Parameter(_uniform((F_, memory), 1.0 / math.sqrt(memory)))
        self.bias = Parameter(np.zeros(units, np.float32))
        self.cfg = (input_size, units, memory, rank, activation)

    def forward(self, x):
        return F.svdf(x, self.weights_feature, self.weights_time, self.bias, rank=self.cfg[3],
                      activation=self.cfg[4])

    def extra_repr(self):
        return f"{self.cfg[0]}, {self.cfg[1]}, memory={self.cfg[2]}, rank={self.cfg[3]}, activation={self.cfg[4]!r}"
