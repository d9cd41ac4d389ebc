"""Every registered op, table-driven: forward against PyTorch (float64 and float32), gradients
against torch.autograd and against centered finite differences in float64 (relative error below
1e-6), including broadcasting and the stride/padding/dilation/groups variants of conv and pooling.

Inputs are drawn away from non-differentiable points (relu at 0, ties in max/maximum/max-pool) so
finite differences are meaningful; behaviour *at* those points is tested in
tests/autodiff/test_nondiff.py.
"""
import dataclasses
import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import kiln.frontend as kf
from kiln.autodiff import check_grads, vjp
from kiln.frontend import functional as F
from kiln.frontend.ops.nn import dropout_mask
from kiln.frontend.registry import OPS
from kiln.frontend.types import TensorType

from . import torch_ref as R

FD_TOL = 1e-6
WORST = {}      # case id -> worst FD relative error (printed by test_report_worst_fd_error)


# ---- input generators (rng -> array) ------------------------------------------------------------
def normal(*shape):
    return lambda rng: rng.standard_normal(shape)


def positive(*shape, lo=0.5):
    return lambda rng: lo + rng.random(shape) * 2.0


def away(*shape, kinks=(0.0,), gap=0.05, lo=-2.0, hi=2.0):
    """Uniform in [lo, hi] but at least ``gap`` from every kink."""
    def gen(rng):
        x = rng.uniform(lo, hi, shape)
        for k in kinks:
            near = np.abs(x - k) < gap
            x = np.where(near, k + np.where(x >= k, gap, -gap) * 2, x)
        return x
    return gen


def distinct(*shape, spacing=0.01):
    """All values distinct (at least ``spacing`` apart): no ties for max, maximum or max-pool."""
    def gen(rng):
        n = int(np.prod(shape))
        v = (np.arange(n) - n / 2) * spacing * (1 + rng.random())
        return rng.permutation(v).reshape(shape)
    return gen


def integers(*shape, lo=-2, hi=3):
    """Small integers (as floats): comparisons see plenty of ties."""
    return lambda rng: rng.integers(lo, hi, shape).astype(np.float64)


def booleans(*shape):
    return lambda rng: rng.random(shape) < 0.5


def key(value=1234):
    return lambda rng: np.asarray(value, np.int64)


def interleaved(*shapes, spacing=0.01):
    """Several arrays whose values are all distinct from each other (maximum/minimum without ties)."""
    def gens():
        sizes = [int(np.prod(s)) for s in shapes]
        cache = {}

        def make(k):
            def gen(rng):
                if "v" not in cache or cache.get("rng") is not rng:
                    n = sum(sizes)
                    cache["v"] = rng.permutation((np.arange(n) - n / 2) * spacing)
                    cache["rng"] = rng
                off = sum(sizes[:k])
                return cache["v"][off:off + sizes[k]].reshape(shapes[k])
            return gen
        return [make(k) for k in range(len(shapes))]
    return gens()


@dataclasses.dataclass
class Case:
    id: str
    op: str                 # the registry op this case covers
    kfn: callable           # Kiln: (*Tensors) -> Tensor
    tfn: callable           # PyTorch: (*torch tensors) -> torch tensor (float64 in, same layout)
    inputs: list            # generators rng -> ndarray
    grad: bool = True       # differentiable (float output)
    f32_tol: float = 1e-5

    def arrays(self):
        rng = np.random.default_rng(zlib.crc32(self.id.encode()))
        return [g(rng) for g in self.inputs]


CASES = []


def case(*a, **k):
    CASES.append(Case(*a, **k))


# ---- unary ---------------------------------------------------------------------------------------
case("neg", "neg", F.neg, torch.neg, [normal(3, 4)])
case("exp", "exp", F.exp, torch.exp, [normal(3, 4)])
case("log", "log", F.log, torch.log, [positive(3, 4)])
case("sqrt", "sqrt", F.sqrt, torch.sqrt, [positive(3, 4)])
case("tanh", "tanh", F.tanh, torch.tanh, [normal(3, 4)])
case("sigmoid", "sigmoid", F.sigmoid, torch.sigmoid, [normal(2, 3, 4)])
case("relu", "relu", F.relu, torch.relu, [away(3, 4)])
case("relu6", "relu6", F.relu6, TF.relu6, [away(4, 5, kinks=(0.0, 6.0), lo=-3, hi=9)])
for p in (2.0, 3.0, 1.0, 0.0, -1.0):
    case(f"pow-{p:g}", "pow", lambda x, p=p: F.pow(x, p), lambda x, p=p: torch.pow(x, p), [away(3, 4, gap=0.2)])
for p in (0.5, -1.5, 2.5):
    case(f"pow-{p:g}-positive", "pow", lambda x, p=p: x ** p, lambda x, p=p: x ** p, [positive(3, 4)])
case("abs-sugar", "relu", F.abs, torch.abs, [away(3, 4)])

# ---- binary, with broadcasting ---------------------------------------------------------------------
BCAST = [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((3, 1), (1, 4)), ((), (2, 3)), ((2, 1, 4), (3, 1))]
for a, b in BCAST:
    tag = f"{'x'.join(map(str, a)) or 'scalar'}-{'x'.join(map(str, b)) or 'scalar'}"
    case(f"add-{tag}", "add", F.add, torch.add, [normal(*a), normal(*b)])
    case(f"sub-{tag}", "sub", F.sub, torch.sub, [normal(*a), normal(*b)])
    case(f"mul-{tag}", "mul", F.mul, torch.mul, [normal(*a), normal(*b)])
    case(f"div-{tag}", "div", F.div, torch.div, [normal(*a), away(*b, gap=0.3)])
    case(f"maximum-{tag}", "maximum", F.maximum, torch.maximum, interleaved(a, b))
    case(f"minimum-{tag}", "minimum", F.minimum, torch.minimum, interleaved(a, b))
    for name, tfn in (("equal", torch.eq), ("not_equal", torch.ne), ("less", torch.lt),
                      ("less_equal", torch.le), ("greater", torch.gt), ("greater_equal", torch.ge)):
        case(f"{name}-{tag}", name, getattr(F, name), tfn, [integers(*a), integers(*b)], grad=False)
    case(f"logical_and-{tag}", "logical_and", F.logical_and, torch.logical_and, [booleans(*a), booleans(*b)], grad=False)
    case(f"logical_or-{tag}", "logical_or", F.logical_or, torch.logical_or, [booleans(*a), booleans(*b)], grad=False)
case("operators", "add", lambda a, b: (2.0 - a) * b / 3.0 + a ** 2 - (-b),
     lambda a, b: (2.0 - a) * b / 3.0 + a ** 2 - (-b), [normal(3, 4), normal(4)])
case("logical_not", "logical_not", F.logical_not, torch.logical_not, [booleans(3, 4)], grad=False)
case("where", "where", F.where, torch.where, [booleans(3, 1), normal(3, 4), normal(4)])
case("where-scalar-branch", "where", lambda c, a: F.where(c, a, 0.5),
     lambda c, a: torch.where(c, a, torch.tensor(0.5, dtype=a.dtype)), [booleans(2, 3), normal(2, 3)])
case("where-from-compare", "where", lambda a, b: F.where(a > b, a * b, a - b),
     lambda a, b: torch.where(a > b, a * b, a - b), [normal(3, 4), normal(3, 4)])
case("cast-f32-roundtrip", "cast", lambda x: F.cast(F.cast(x, "float32") * 2.0, x.dtype),
     lambda x: (x.to(torch.float32) * 2.0).to(x.dtype), [normal(3, 4)])
case("cast-to-int", "cast", lambda x: F.cast(x, "int32"), lambda x: x.to(torch.int32),
     [lambda rng: rng.uniform(-5, 5, (3, 4))], grad=False)

# ---- reductions, softmax ---------------------------------------------------------------------------
for axes, keep in ((None, False), ([0], False), ([1, 2], True), ([-1], False), ([0, 2], False), (None, True)):
    tag = f"{axes}-keep{int(keep)}".replace(" ", "")
    tax = tuple(axes) if axes is not None else tuple(range(3))
    case(f"sum-{tag}", "sum", lambda x, a=axes, k=keep: F.sum(x, a, k), lambda x, a=tax, k=keep: x.sum(a, keepdim=k),
         [normal(2, 3, 4)])
    case(f"mean-{tag}", "mean", lambda x, a=axes, k=keep: F.mean(x, a, k), lambda x, a=tax, k=keep: x.mean(a, keepdim=k),
         [normal(2, 3, 4)])
    case(f"max-{tag}", "max", lambda x, a=axes, k=keep: F.max(x, a, k), lambda x, a=tax, k=keep: x.amax(a, keepdim=k),
         [distinct(2, 3, 4)])
for ax in (-1, 0, 1):
    case(f"softmax-{ax}", "softmax", lambda x, a=ax: F.softmax(x, a), lambda x, a=ax: torch.softmax(x, a), [normal(3, 4, 5)])
    case(f"log_softmax-{ax}", "log_softmax", lambda x, a=ax: F.log_softmax(x, a),
         lambda x, a=ax: torch.log_softmax(x, a), [normal(3, 4, 5)])

# ---- shape ops -------------------------------------------------------------------------------------
case("reshape", "reshape", lambda x: F.reshape(x, (4, -1)), lambda x: x.reshape(4, -1), [normal(2, 3, 4)])
case("reshape-method", "reshape", lambda x: x.reshape(6, 4).flatten(0) * 1.0, lambda x: x.reshape(-1), [normal(2, 3, 4)])
case("transpose-reverse", "transpose", lambda x: x.T, lambda x: x.permute(2, 1, 0), [normal(2, 3, 4)])
case("transpose-perm", "transpose", lambda x: x.transpose(1, 2, 0), lambda x: x.permute(1, 2, 0), [normal(2, 3, 4)])
case("concat-0", "concat", lambda a, b: F.concat([a, b], 0), lambda a, b: torch.cat([a, b], 0),
     [normal(2, 3), normal(4, 3)])
case("concat-neg1-three", "concat", lambda a, b, c: F.concat([a, b, c], -1), lambda a, b, c: torch.cat([a, b, c], -1),
     [normal(2, 3, 1), normal(2, 3, 2), normal(2, 3, 3)])
case("concat-same-twice", "concat", lambda a: F.concat([a, a * 2.0], 1), lambda a: torch.cat([a, a * 2.0], 1),
     [normal(2, 3)])
case("pad", "pad", lambda x: F.pad(x, [(1, 0), (2, 3)]), lambda x: TF.pad(x, (2, 3, 1, 0)), [normal(3, 4)])
case("pad-value", "pad", lambda x: F.pad(x, [0, 0, 1, 1, 0, 2], value=-1.5),
     lambda x: TF.pad(x, (0, 2, 1, 1), value=-1.5), [normal(2, 3, 4)])
case("slice", "slice", lambda x: F.slice(x, [1, 0], [3, 4]), lambda x: x[1:3, 0:4], [normal(4, 5)])
case("slice-strided", "slice", lambda x: F.slice(x, [0, 1, 0], [2, 5, 4], [1, 2, 3]), lambda x: x[0:2, 1:5:2, 0:4:3],
     [normal(2, 6, 5)])
case("getitem", "slice", lambda x: x[1, ::2, -3:] * 1.0, lambda x: x[1, ::2, -3:], [normal(3, 5, 4)])
case("getitem-ellipsis", "slice", lambda x: x[..., 1:3], lambda x: x[..., 1:3], [normal(2, 3, 4)])
case("getitem-empty-range", "slice", lambda x: F.sum(x[3:1]) + F.sum(x), lambda x: x[3:1].sum() + x.sum(), [normal(4, 2)])


def _torch_slice_grad(g, shape, sl):
    z = torch.zeros(shape, dtype=g.dtype)
    z[sl] = g
    return z


case("slice_grad", "slice_grad",
     lambda g: F.emit("slice_grad", [g], shape=[5, 6], begin=[1, 0], end=[5, 6], strides=[2, 3]),
     lambda g: _torch_slice_grad(g, (5, 6), (slice(1, 5, 2), slice(0, 6, 3))), [normal(2, 2)])
case("broadcast_to", "broadcast_to", lambda x: F.broadcast_to(x, (2, 3, 4)), lambda x: x.expand(2, 3, 4),
     [normal(3, 1)])
case("broadcast_to-scalar", "broadcast_to", lambda x: F.broadcast_to(x, (2, 3)), lambda x: x.expand(2, 3), [normal()])

# ---- matmul / dense --------------------------------------------------------------------------------
for a, b in (((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (3, 4, 2)), ((4, 3), (2, 3, 5))):
    case(f"matmul-{'x'.join(map(str, a))}@{'x'.join(map(str, b))}", "matmul", F.matmul, torch.matmul,
         [normal(*a), normal(*b)])
case("matmul-operator", "matmul", lambda a, b: a @ b, lambda a, b: a @ b, [normal(3, 4), normal(4, 2)])
for act in ("none", "relu", "relu6"):
    case(f"dense-bias-{act}", "dense", lambda x, w, b, act=act: F.dense(x, w, b, act),
         lambda x, w, b, act=act: R.act(TF.linear(x, w, b), act),
         [normal(5, 4), lambda rng: rng.standard_normal((3, 4)) * 3, normal(3)])
case("dense-nobias", "dense", lambda x, w: F.dense(x, w), lambda x, w: TF.linear(x, w), [normal(5, 4), normal(3, 4)])
case("dense-vector", "dense", lambda x, w, b: F.dense(x, w, b), TF.linear, [normal(4), normal(3, 4), normal(3)])
case("dense-3d", "dense", lambda x, w, b: F.dense(x, w, b, "relu"), lambda x, w, b: TF.relu(TF.linear(x, w, b)),
     [normal(2, 3, 4), normal(5, 4), normal(5)])

# ---- conv2d: NHWC x OHWI ---------------------------------------------------------------------------
# (id, x shape, w shape, stride, padding, dilation, groups, bias, activation)
CONVS = [
    ("3x3-valid", (2, 5, 6, 3), (4, 3, 3, 3), 1, "valid", 1, 1, True, "none"),
    ("3x3-same", (1, 5, 6, 2), (3, 3, 3, 2), 1, "same", 1, 1, True, "none"),
    ("3x3-same-stride2-odd", (1, 7, 6, 2), (3, 3, 3, 2), 2, "same", 1, 1, False, "none"),
    ("2x2-same-stride2-even-kernel", (1, 6, 5, 2), (2, 2, 2, 2), 2, "same", 1, 1, True, "none"),
    ("4x3-same-stride3x2", (1, 8, 7, 1), (2, 4, 3, 1), (3, 2), "same", 1, 1, True, "none"),
    ("3x3-stride2-valid", (2, 7, 7, 2), (3, 3, 3, 2), 2, "valid", 1, 1, True, "relu"),
    ("3x3-dilation2", (1, 7, 8, 2), (2, 3, 3, 2), 1, "valid", 2, 1, True, "none"),
    ("3x3-dilation2-same-stride2", (1, 9, 8, 2), (2, 3, 3, 2), 2, "same", (2, 1), 1, True, "none"),
    ("explicit-asym", (1, 5, 5, 2), (3, 3, 2, 2), 1, [1, 0, 2, 1], 1, 1, True, "none"),
    ("explicit-sym", (1, 5, 5, 2), (3, 3, 3, 2), 2, [1, 1, 1, 1], 1, 1, True, "relu6"),
    ("groups2", (1, 5, 5, 4), (6, 3, 3, 2), 1, "same", 1, 2, True, "none"),
    ("depthwise", (2, 5, 6, 3), (3, 3, 3, 1), 1, "same", 1, 3, True, "none"),
    ("depthwise-mult2-stride2", (1, 6, 6, 2), (4, 3, 3, 1), 2, "same", 1, 2, True, "relu"),
    ("1x1", (2, 4, 4, 3), (5, 1, 1, 3), 1, "valid", 1, 1, True, "none"),
]
for cid, xs, ws, st, pad, dil, grp, bias, act in CONVS:
    kw = dict(stride=st, padding=pad, dilation=dil, groups=grp, activation=act)
    ins = [normal(*xs), normal(*ws)] + ([normal(ws[0])] if bias else [])
    case(f"conv2d-{cid}", "conv2d",
         lambda x, w, b=None, kw=kw: F.conv2d(x, w, b, **kw),
         lambda x, w, b=None, kw=kw: R.conv2d(x, w, b, **kw), ins)

for cid, xs, ws, st, pad, dil, grp in (("same-stride2", (1, 7, 6, 2), (3, 3, 3, 2), 2, "same", 1, 1),
                                       ("dilated-groups", (1, 7, 7, 4), (4, 3, 3, 2), 1, [2, 0, 1, 1], 2, 2),
                                       ("depthwise-stride2", (2, 5, 5, 3), (3, 3, 3, 1), 2, "valid", 1, 3)):
    kw = dict(stride=st, padding=pad, dilation=dil, groups=grp)
    G = kf.trace(lambda x, w, kw=kw: F.conv2d(x, w, **kw), TensorType(xs, "float64"), TensorType(ws, "float64"))
    ys = G.types[G.outputs[0]].shape
    kk = dict(stride=F._pair(st), padding=F._padding(pad), dilation=F._pair(dil), groups=grp)
    case(f"conv2d_grad_input-{cid}", "conv2d_grad_input",
         lambda gy, w, xs=xs, kk=kk: F.conv2d_grad_input(gy, w, xs, **kk),
         lambda gy, w, xs=xs, kw=kw: R.conv2d_grad_input(gy, w, xs, **kw), [normal(*ys), normal(*ws)])
    case(f"conv2d_grad_weight-{cid}", "conv2d_grad_weight",
         lambda x, gy, ws=ws, kk=kk: F.conv2d_grad_weight(x, gy, ws, **kk),
         lambda x, gy, ws=ws, kw=kw: R.conv2d_grad_weight(x, gy, ws, **kw), [normal(*xs), normal(*ys)])

# ---- pooling ---------------------------------------------------------------------------------------
# (id, x shape, pool, stride, padding)
POOLS = [
    ("2x2", (2, 4, 6, 3), 2, None, "valid"),
    ("3x3-stride1", (1, 5, 5, 2), 3, 1, "valid"),
    ("3x3-stride2-same-odd", (1, 7, 6, 2), 3, 2, "same"),
    ("2x3-same", (1, 5, 7, 1), (2, 3), (2, 2), "same"),
    ("3x3-stride2-pad1", (1, 6, 6, 2), 3, 2, [1, 1, 1, 1]),
    ("3x2-explicit-asym", (1, 5, 5, 2), (3, 2), 1, [0, 2, 1, 0]),
    ("2x2-stride1-same", (1, 4, 5, 2), 2, 1, "same"),
]
for pid, xs, pool, st, pad in POOLS:
    for incl in (False, True):
        kw = dict(pool=pool, stride=st, padding=pad, count_include_pad=incl)
        case(f"avg_pool2d-{pid}{'-include_pad' if incl else ''}", "avg_pool2d",
             lambda x, kw=kw: F.avg_pool2d(x, **kw), lambda x, kw=kw: R.avg_pool2d(x, **kw), [normal(*xs)])
    kw = dict(pool=pool, stride=st, padding=pad)
    case(f"max_pool2d-{pid}", "max_pool2d", lambda x, kw=kw: F.max_pool2d(x, **kw),
         lambda x, kw=kw: R.max_pool2d(x, **kw), [distinct(*xs)])

for pid, xs, pool, st, pad in (POOLS[2], POOLS[4], POOLS[5]):
    G = kf.trace(lambda x: F.max_pool2d(x, pool, st, pad), TensorType(xs, "float64"))
    ys = G.types[G.outputs[0]].shape
    ka = dict(pool=F._pair(pool), stride=F._pair(st) if st is not None else None, padding=F._padding(pad))
    kw = dict(pool=pool, stride=st, padding=pad)
    for incl in (False, True):
        case(f"avg_pool2d_grad-{pid}{'-include_pad' if incl else ''}", "avg_pool2d_grad",
             lambda gy, xs=xs, ka=ka, incl=incl: F.avg_pool2d_grad(gy, xs, **ka, count_include_pad=incl),
             lambda gy, xs=xs, kw=kw, incl=incl: R.avg_pool2d_grad(gy, xs, **kw, count_include_pad=incl),
             [normal(*ys)])
    case(f"max_pool2d_grad-{pid}", "max_pool2d_grad",
         lambda x, gy, ka=ka: F.max_pool2d_grad(x, gy, **ka),
         lambda x, gy, kw=kw: R.max_pool2d_grad(x, gy, **kw), [distinct(*xs), normal(*ys)])
    case(f"max_pool2d_gather-{pid}", "max_pool2d_gather",
         lambda x, g, ka=ka: F.max_pool2d_gather(x, g, **ka),
         lambda x, g, kw=kw: R.max_pool2d_gather(x, g, **kw), [distinct(*xs), normal(*xs)])

# ---- dropout: the mask is Kiln's counter-based one; torch multiplies by the same mask -----------------
case("dropout", "dropout", lambda x, k: F.dropout(x, k, 0.3, salt=7),
     lambda x, k: x * torch.from_numpy(dropout_mask(x.shape, int(k), 7, 0.3, np.float64)).to(x.dtype),
     [normal(4, 5), key(99)])

# ---- the element-wise / activation family (frontend/ops/activations.py) -------------------------------
def _off_grid(*shape):
    """Values a tenth or more from integers and half-integers (floor, ceil, round are flat there)."""
    return lambda rng: rng.integers(-4, 4, shape) + rng.uniform(0.1, 0.4, shape) * rng.choice([1, -1], shape)


case("abs", "abs", F.abs, torch.abs, [away(3, 4)])
case("square", "square", lambda x: F.emit("square", [x]), torch.square, [normal(3, 4)])
case("rsqrt", "rsqrt", F.rsqrt, torch.rsqrt, [positive(3, 4)])
case("sin", "sin", F.sin, torch.sin, [normal(3, 4)])
case("cos", "cos", F.cos, torch.cos, [normal(3, 4)])
case("floor", "floor", F.floor, torch.floor, [_off_grid(3, 4)])
case("ceil", "ceil", F.ceil, torch.ceil, [_off_grid(3, 4)])
case("round", "round", F.round, torch.round, [_off_grid(3, 4)])
case("round-half-even", "round", F.round, torch.round, [lambda rng: np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5])],
     grad=False)
case("elu", "elu", F.elu, TF.elu, [away(3, 4)])
case("hard_swish", "hard_swish", F.hard_swish, TF.hardswish, [away(4, 5, kinks=(-3.0, 3.0), lo=-5, hi=5)])
case("leaky_relu", "leaky_relu", lambda x: F.leaky_relu(x, 0.3), lambda x: TF.leaky_relu(x, 0.3), [away(3, 4)])
case("prelu", "prelu", F.prelu, lambda x, a: torch.where(x >= 0, x, a * x), [away(2, 3, 4), normal(4)])
case("squared_difference", "squared_difference", F.squared_difference, lambda a, b: (a - b) ** 2,
     [normal(2, 3, 4), normal(3, 1)])
case("floor_div", "floor_div", F.floor_div, lambda a, b: torch.floor(a / b), [normal(3, 4), away(4, gap=0.3)],
     grad=False)
case("floor_mod", "floor_mod", F.floor_mod, torch.remainder, [normal(3, 4), away(4, gap=0.3)])
case("add_n", "add_n", lambda a, b, c: F.add_n([a, b, c]), lambda a, b, c: a + b + c,
     [normal(3, 4), normal(3, 4), normal(3, 4)])


# ---- recurrent (frontend/ops/recurrent.py) and L2 pooling (frontend/ops/l2pool.py) ------------------
def _torch_lstm(x, *p, time_major=False, clip=0.0):
    wx, wh, b, h, c = p[0:4], p[4:8], p[8:12], p[12], p[13]
    xs = x if time_major else x.transpose(0, 1)
    hs = []
    for t in range(xs.shape[0]):
        pre = [xs[t] @ wx[k].T + h @ wh[k].T + b[k] for k in range(4)]
        c = torch.sigmoid(pre[1]) * c + torch.sigmoid(pre[0]) * torch.tanh(pre[2])
        c = c.clamp(-clip, clip) if clip > 0 else c
        h = torch.sigmoid(pre[3]) * torch.tanh(c)
        hs.append(h)
    y = torch.stack(hs)
    return y if time_major else y.transpose(0, 1)


for tm, clip in ((False, 0.0), (True, 0.0), (False, 0.8)):
    xs_ = (2, 2, 3) if tm else (2, 2, 3)
    case(f"lstm-{'tm' if tm else 'bm'}-clip{clip:g}", "lstm",
         lambda x, *p, tm=tm, clip=clip: F.lstm(x, p[0:4], p[4:8], p[8:12], p[12], p[13], tm, clip),
         lambda x, *p, tm=tm, clip=clip: _torch_lstm(x, *p, time_major=tm, clip=clip),
         [normal(*xs_)] + [normal(3, 3)] * 8 + [normal(3)] * 4 + [normal(2, 3)] * 2)
for tid, xs, os_, st, pad, act in (("same-s2", (1, 3, 3, 2), (1, 6, 5, 3), 2, "same", "none"),
                                   ("valid-s1-relu6", (2, 3, 4, 2), (2, 5, 6, 1), 1, "valid", "relu6")):
    case(f"transpose_conv2d-{tid}", "transpose_conv2d",
         lambda x, w, b, os_=os_, st=st, pad=pad, act=act: F.transpose_conv2d(x, w, os_, b, st, pad, act),
         lambda x, w, b, os_=os_, st=st, pad=pad, act=act: (lambda y: y.clamp(0, 6) if act == "relu6" else y)(
             R.conv2d_grad_input(x, w.permute(3, 1, 2, 0), os_, stride=st, padding=pad) + b),
         [normal(*xs), normal(os_[3], 3, 3, xs[3]), normal(os_[3])])
for pid, xs, pool, st, pad in (POOLS[0], POOLS[2], POOLS[3]):
    kw = dict(pool=pool, stride=st, padding=pad)
    case(f"l2_pool2d-{pid}", "l2_pool2d", lambda x, kw=kw: F.l2_pool2d(x, **kw),
         lambda x, kw=kw: torch.sqrt(R.avg_pool2d(x * x, **kw, count_include_pad=False)), [away(*xs)])
# ---- data movement and reductions (frontend/ops: gather, resize, reductions, argcum, l2norm) -------
GIDX = np.asarray([[3, 0], [1, 1]], np.int32)


def _torch_gather_grad(g, shape, axis, idx):
    z = torch.zeros(shape, dtype=g.dtype)
    moved = g.reshape(shape[:axis] + (idx.size,) + shape[axis + 1:])
    return z.index_add(axis, torch.tensor(idx.ravel(), dtype=torch.int64), moved)


def _nchw(fn):
    return lambda x: fn(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


def _torch_resize_grad(g, in_hw, mode, ac):
    x = torch.zeros((g.shape[0], g.shape[3]) + tuple(in_hw), dtype=g.dtype, requires_grad=True)
    y = TF.interpolate(x, size=tuple(g.shape[1:3]), mode=mode, **({} if mode == "nearest" else {"align_corners": ac}))
    (gx,) = torch.autograd.grad(y, x, g.permute(0, 3, 1, 2), create_graph=True)
    return gx.permute(0, 2, 3, 1)


case("gather", "gather", lambda x: F.gather(x, GIDX, axis=1), lambda x: x[:, torch.tensor(GIDX, dtype=torch.int64)],
     [normal(3, 4, 2)])
case("gather_grad", "gather_grad", lambda g: F.emit("gather_grad", [g, GIDX], shape=[3, 4, 2], axis=1),
     lambda g: _torch_gather_grad(g, (3, 4, 2), 1, GIDX), [normal(3, 2, 2, 2)])
# power-of-two scales: TFLite's float32 source positions are exact, as PyTorch's doubles
case("resize-bilinear-half-pixel", "resize", lambda x: F.resize(x, (8, 6), "bilinear", half_pixel_centers=True),
     _nchw(lambda x: TF.interpolate(x, size=(8, 6), mode="bilinear", align_corners=False)), [normal(2, 4, 3, 2)])
case("resize-bilinear-align-corners", "resize", lambda x: F.resize(x, (7, 5), "bilinear", align_corners=True),
     _nchw(lambda x: TF.interpolate(x, size=(7, 5), mode="bilinear", align_corners=True)), [normal(1, 4, 3, 2)])
case("resize-nearest", "resize", lambda x: F.resize(x, (8, 2), "nearest"),
     _nchw(lambda x: TF.interpolate(x, size=(8, 2), mode="nearest")), [normal(1, 4, 4, 3)])
case("resize_grad", "resize_grad",
     lambda g: F.emit("resize_grad", [g], in_size=[4, 3], size=[8, 6], mode="bilinear", half_pixel_centers=True),
     lambda g: _torch_resize_grad(g, (4, 3), "bilinear", False), [normal(2, 8, 6, 2)])
case("min", "min", lambda x: F.min(x, 1), lambda x: torch.amin(x, 1), [interleaved((3, 4, 2))[0]])
case("argmax", "argmax", lambda x: F.argmax(x, 1, "int64"), lambda x: torch.argmax(x, 1), [normal(3, 5)], grad=False)
case("argmin", "argmin", lambda x: F.argmin(x, -1, "int64"), lambda x: torch.argmin(x, -1), [normal(3, 5)],
     grad=False)
case("cumsum", "cumsum", lambda x: F.cumsum(x, 1), lambda x: torch.cumsum(x, 1), [normal(3, 5)])
case("cumsum-exclusive-reverse", "cumsum", lambda x: F.cumsum(x, 0, exclusive=True, reverse=True),
     lambda x: torch.flip(torch.cumsum(torch.flip(x, [0]), 0), [0]) - x, [normal(4, 3)])
case("l2_normalize", "l2_normalize", F.l2_normalize, lambda x: TF.normalize(x, dim=-1, eps=1e-6), [normal(3, 5)])
# frontend/ops/dynamic.py: start [2, 5] is clamped to [1, 2] for a [2, 3] block of a [3, 5] tensor


def _torch_dus(x, u):
    y = x.clone()
    y[1:3, 2:5] = u
    return y


case("dynamic_update_slice", "dynamic_update_slice", lambda x, u: F.dynamic_update_slice(x, u, [2, 5]), _torch_dus,
     [normal(3, 5), normal(2, 3)])
case("dynamic_slice", "dynamic_slice", lambda x: F.dynamic_slice(x, [-1, 4], [2, 3]), lambda x: x[0:2, 2:5],
     [normal(3, 5)])
# frontend/ops/svdf.py: the state update (memory shifted, newest column = x @ wf.T) and the output


def _torch_svdf_state(x, wf, st):
    s = st.reshape(2, 6, 3)
    return torch.cat([s[:, :, 1:], (x @ wf.T)[:, :, None]], dim=2).reshape(2, 18)


def _torch_svdf(st, wt, b):
    scratch = (st.reshape(2, 6, 3) * wt[None]).sum(2)
    return torch.relu(b[None] + scratch.reshape(2, 3, 2).sum(2))


case("svdf_state", "svdf_state", lambda x, wf, st: F.emit("svdf_state", [x, wf, st]), _torch_svdf_state,
     [normal(2, 5), normal(6, 5), normal(2, 18)])
case("svdf", "svdf", lambda st, wt, b: F.emit("svdf", [st, wt, b], rank=2, activation="relu"), _torch_svdf,
     [normal(2, 18), normal(6, 3), normal(3)])
case("reduce_all", "reduce_all", lambda b: F.reduce_all(b, [0, 2], keepdims=True),
     lambda b: torch.all(torch.all(b, 0, keepdim=True), 2, keepdim=True), [booleans(3, 4, 2)], grad=False)


IDS = [c.id for c in CASES]
assert len(IDS) == len(set(IDS)), "duplicate case ids"
GRAD_CASES = [c for c in CASES if c.grad]


# ---- helpers -------------------------------------------------------------------------------------
def _ktype(a, dtype):
    a = np.asarray(a)
    return TensorType(a.shape, dtype if a.dtype.kind == "f" else a.dtype.name)


def _kiln(c, arrays, dtype="float64"):
    g = kf.trace(c.kfn, *[_ktype(a, dtype) for a in arrays], name=c.id.replace("-", "_"))
    feeds = [np.asarray(a, dtype) if np.asarray(a).dtype.kind == "f" else a for a in arrays]
    return g, feeds


def _torch_inputs(arrays, dtype=torch.float64):
    out = []
    for a in arrays:
        a = np.asarray(a)
        if a.dtype.kind == "f":
            out.append(torch.tensor(a, dtype=dtype, requires_grad=True))
        else:
            out.append(torch.tensor(a))
    return out


# ---- tests ---------------------------------------------------------------------------------------
# float32-only TFLite custom ops without a PyTorch counterpart: op -> the test that checks it against LiteRT
ORACLE_LITERT = {"detection_postprocess": "tests/frontend/test_ops_detection.py"}


def test_every_op_has_a_case():
    """Every float op the frontend registers has a row here (the quantisation ops of
    frontend/ops/quant.py are checked against LiteRT and their own references in tests/quantize;
    TFLite custom ops PyTorch has no counterpart of are checked against LiteRT in ORACLE_LITERT)."""
    covered = {c.op for c in CASES} | set(ORACLE_LITERT)
    frontend_ops = {n for n, op in OPS.items() if op.infer and op.infer.__module__.startswith("kiln.frontend.ops")
                    and op.infer.__module__ != "kiln.frontend.ops.quant"}
    missing = sorted(frontend_ops - covered)
    assert not missing, f"ops without a PyTorch/FD test case in tests/frontend/test_ops.py: {missing}"
    assert all(c.op in OPS for c in CASES)


@pytest.mark.parametrize("c", CASES, ids=IDS)
def test_forward_float64_matches_torch(c):
    arrays = c.arrays()
    g, feeds = _kiln(c, arrays)
    got = kf.run(g, *feeds)[0]
    want = c.tfn(*_torch_inputs(arrays)).detach().numpy()
    assert got.shape == want.shape
    if want.dtype.kind == "f":
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("c", [c for c in CASES if not c.id.startswith("cast")], ids=lambda c: c.id)
def test_forward_float32_matches_torch(c):
    arrays = c.arrays()
    g, feeds = _kiln(c, arrays, "float32")
    got = kf.run(g, *feeds)[0]
    want = c.tfn(*_torch_inputs(arrays, torch.float32)).detach().numpy()
    assert got.dtype == want.dtype, f"dtype {got.dtype} but torch gives {want.dtype}"
    np.testing.assert_allclose(got, want, rtol=c.f32_tol, atol=c.f32_tol)


@pytest.mark.parametrize("c", GRAD_CASES, ids=lambda c: c.id)
def test_vjp_matches_torch_autograd(c):
    arrays = c.arrays()
    g, feeds = _kiln(c, arrays)
    wrt = [n for n, a in zip(g.inputs, arrays) if np.asarray(a).dtype.kind == "f"]
    out_t = g.types[g.outputs[0]]
    u = np.random.default_rng(1).standard_normal(out_t.shape)
    gv = vjp(g, wrt=wrt)
    got = kf.run(gv, *feeds, u)
    tin = _torch_inputs(arrays)
    y = c.tfn(*tin)
    tw = [t for t in tin if t.requires_grad]
    want = torch.autograd.grad(y, tw, torch.tensor(u), allow_unused=True)
    for name, a, b, t in zip(wrt, got, want, tw):
        b = np.zeros(t.shape) if b is None else b.numpy()
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10, err_msg=f"d/d{name}")


@pytest.mark.parametrize("c", GRAD_CASES, ids=lambda c: c.id)
def test_grad_matches_finite_differences(c):
    arrays = c.arrays()
    g, feeds = _kiln(c, arrays)
    res = check_grads(g, feeds, tol=FD_TOL)
    WORST[c.id] = max(res.worst.values(), default=0.0)
    assert res.ok, f"{c.id}:\n{res}"


def test_report_worst_fd_error():
    """Summary line for the report (runs after the FD table when the whole file runs)."""
    if WORST:
        k = max(WORST, key=WORST.get)
        print(f"\nworst FD relative error over {len(WORST)} cases: {WORST[k]:.3g} ({k})")
        assert WORST[k] < FD_TOL


# ---- second order: grad-of-grad for every differentiable case ----------------------------------------
def _torch_double_backward(c, arrays, u, rs):
    tin = _torch_inputs(arrays)
    tw = [t for t in tin if t.requires_grad]
    y = c.tfn(*tin)
    g1 = torch.autograd.grad(y, tw, torch.tensor(u), create_graph=True, allow_unused=True)
    s = sum((g * torch.tensor(r)).sum() for g, r in zip(g1, rs) if g is not None and g.requires_grad)
    if not torch.is_tensor(s):
        return [np.zeros(t.shape) for t in tw]
    g2 = torch.autograd.grad(s, tw, allow_unused=True)
    return [np.zeros(t.shape) if g is None else g.numpy(force=True) for g, t in zip(g2, tw)]


@pytest.mark.parametrize("c", GRAD_CASES, ids=lambda c: c.id)
def test_grad_of_grad_matches_torch_and_fd(c):
    """d/dx <vjp(u), r> against torch double backward, and check_grads(order=2) against FD."""
    from kiln.autodiff import grad
    from kiln.autodiff.forward import _contract
    from kiln.frontend.tensor import Tensor

    arrays = c.arrays()
    g, feeds = _kiln(c, arrays)
    wrt = [n for n, a in zip(g.inputs, arrays) if np.asarray(a).dtype.kind == "f"]
    rng = np.random.default_rng(2)
    u = rng.standard_normal(g.types[g.outputs[0]].shape)
    rs = [rng.standard_normal(g.types[w].shape) for w in wrt]
    gv = vjp(g, wrt=wrt)
    pairs = [(Tensor(gv, o), Tensor(gv, gv.add_const(gv.fresh("r"), r))) for o, r in zip(gv.outputs, rs)]
    gv.outputs = [_contract(gv, pairs).name]
    gg = grad(gv, wrt=wrt)
    got = kf.run(gg, *feeds, u)
    want = _torch_double_backward(c, arrays, u, rs)
    for name, a, b in zip(wrt, got, want):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9, err_msg=f"d2/d{name}")
    res = check_grads(g, feeds, order=2, tol=FD_TOL)
    assert res.ok, f"{c.id}:\n{res}"
