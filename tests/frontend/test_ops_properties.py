"""Property tests (hypothesis): random broadcasting, reduction axes, slices and conv/pool geometry,
forward and VJP against PyTorch in float64. The fixed table is tests/frontend/test_ops.py."""
import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import mutually_broadcastable_shapes

import kiln.frontend as kf
from kiln.autodiff import vjp
from kiln.frontend import functional as F
from kiln.frontend.errors import ShapeError
from kiln.frontend.types import TensorType

from . import torch_ref as R

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check(kfn, tfn, arrays, rtol=1e-10):
    g = kf.trace(kfn, *[TensorType(a.shape, "float64") for a in arrays])
    y = kf.run(g, *arrays)[0]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    ty = tfn(*ts)
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=rtol, atol=rtol)
    u = np.random.default_rng(0).standard_normal(y.shape)
    got = kf.run(vjp(g, wrt=g.inputs), *arrays, u)
    want = torch.autograd.grad(ty, ts, torch.tensor(u), allow_unused=True)
    for a, b, t in zip(got, want, ts):
        np.testing.assert_allclose(a, np.zeros(t.shape) if b is None else b.numpy(), rtol=rtol, atol=rtol)


BINARY = {"add": (F.add, torch.add), "sub": (F.sub, torch.sub), "mul": (F.mul, torch.mul),
          "div": (F.div, torch.div), "maximum": (F.maximum, torch.maximum), "minimum": (F.minimum, torch.minimum),
          "where": (lambda a, b: F.where(a > b, a, b * 2.0), lambda a, b: torch.where(a > b, a, b * 2.0))}


@SETTINGS
@given(shapes=mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=3),
       op=st.sampled_from(sorted(BINARY)), seed=st.integers(0, 2 ** 16))
def test_binary_broadcasting(shapes, op, seed):
    rng = np.random.default_rng(seed)
    a, b = (rng.standard_normal(s) for s in shapes.input_shapes)
    if op == "div":
        b = np.where(np.abs(b) < 0.2, 0.5, b)
    kfn, tfn = BINARY[op]
    _check(kfn, tfn, [a, b])


@SETTINGS
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=4), data=st.data(),
       op=st.sampled_from(["sum", "mean", "max"]), keep=st.booleans())
def test_reductions_random_axes(shape, data, op, keep):
    nd = len(shape)
    axes = data.draw(st.lists(st.integers(-nd, nd - 1), unique_by=lambda a: a % nd, max_size=nd) | st.none())
    n = int(np.prod(shape))
    x = np.random.default_rng(n).permutation(np.arange(n) * 0.1).reshape(shape)   # no ties
    tax = tuple(range(nd)) if axes is None else tuple(a % nd for a in axes)
    if not tax:     # an empty axis list reduces nothing, as in NumPy
        tfn = lambda t: t * 1.0
    else:
        tfn = {"sum": lambda t: t.sum(tax, keepdim=keep), "mean": lambda t: t.mean(tax, keepdim=keep),
               "max": lambda t: t.amax(tax, keepdim=keep)}[op]
    _check(lambda t: getattr(F, op)(t, axes, keep), tfn, [x])


@SETTINGS
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3), data=st.data())
def test_getitem_random_slices(shape, data):
    idx = []
    for n in shape:
        kind = data.draw(st.sampled_from(["int", "slice", "all"]))
        if kind == "int":
            idx.append(data.draw(st.integers(-n, n - 1)))
        elif kind == "slice":
            idx.append(slice(data.draw(st.integers(-n - 1, n + 1) | st.none()),
                             data.draw(st.integers(-n - 1, n + 1) | st.none()), data.draw(st.integers(1, 3))))
        else:
            idx.append(slice(None))
    idx = tuple(idx)
    x = np.random.default_rng(0).standard_normal(shape)
    _check(lambda t: t[idx] * 1.0, lambda t: t[idx] * 1.0, [x])


@st.composite
def conv_geometry(draw):
    groups = draw(st.sampled_from([1, 1, 2, "dw"]))
    cin = draw(st.integers(1, 3)) * (2 if groups == 2 else 1)
    if groups == "dw":
        groups = cin
        cout = cin * draw(st.integers(1, 2))
    else:
        cout = draw(st.integers(1, 2)) * groups
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dil = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    padding = draw(st.sampled_from(["valid", "same", "explicit"]))
    if padding == "explicit":
        padding = [draw(st.integers(0, 2)) for _ in range(4)]
    h = draw(st.integers((kh - 1) * dil[0] + 1, 8))
    w = draw(st.integers((kw - 1) * dil[1] + 1, 8))
    return dict(x=(draw(st.integers(1, 2)), h, w, cin), w=(cout, kh, kw, cin // groups), stride=stride,
                dilation=dil, padding=padding, groups=groups, bias=draw(st.booleans()))


@SETTINGS
@given(geo=conv_geometry(), seed=st.integers(0, 2 ** 16))
def test_conv2d_random_geometry(geo, seed):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(geo["x"]), rng.standard_normal(geo["w"])]
    if geo["bias"]:
        arrays.append(rng.standard_normal(geo["w"][0]))
    kw = {k: geo[k] for k in ("stride", "padding", "dilation", "groups")}
    _check(lambda x, w, b=None: F.conv2d(x, w, b, **kw), lambda x, w, b=None: R.conv2d(x, w, b, **kw), arrays)


@SETTINGS
@given(h=st.integers(1, 7), w=st.integers(1, 7), pool=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       stride=st.none() | st.tuples(st.integers(1, 3), st.integers(1, 3)),
       padding=st.sampled_from(["valid", "same"]) | st.lists(st.integers(0, 1), min_size=4, max_size=4),
       kind=st.sampled_from(["avg", "avg_include", "max"]), seed=st.integers(0, 2 ** 16))
def test_pool_random_geometry(h, w, pool, stride, padding, kind, seed):
    x = np.random.default_rng(seed).permutation(np.arange(2 * h * w * 2) * 0.01).reshape(2, h, w, 2)
    try:
        kf.trace(lambda t: F.max_pool2d(t, pool, stride, padding), x.shape)
    except ShapeError:
        return          # window does not fit: the shape rule says so
    if kind == "max":
        _check(lambda t: F.max_pool2d(t, pool, stride, padding),
               lambda t: R.max_pool2d(t, pool, stride, padding), [x])
    else:
        inc = kind == "avg_include"
        _check(lambda t: F.avg_pool2d(t, pool, stride, padding, inc),
               lambda t: R.avg_pool2d(t, pool, stride, padding, inc), [x])


def test_pool_padding_must_be_smaller_than_the_window():
    import pytest
    with pytest.raises(ShapeError, match="must be smaller than the window"):
        kf.trace(lambda t: F.max_pool2d(t, 1, 1, [1, 0, 0, 0]), (1, 3, 3, 1))
    with pytest.raises(ShapeError, match="must be smaller than the window"):
        kf.trace(lambda t: F.avg_pool2d(t, 2, 1, [0, 0, 0, 2]), (1, 3, 3, 1))
    kf.trace(lambda t: F.avg_pool2d(t, 2, 1, [1, 1, 1, 1]), (1, 3, 3, 1))
