"""PyTorch references for Kiln's NHWC ops (test-only).

Kiln is NHWC with OHWI conv weights; PyTorch is NCHW with OIHW weights, so every reference
transposes on the way in and out. 'same' padding is re-derived here from the TF/TFLite rule
(out = ceil(in / stride), the odd pixel of padding goes after), independently of Kiln's code.
"""
import numpy as np
import torch
import torch.nn.functional as TF


def nchw(x):
    return x.permute(0, 3, 1, 2)


def nhwc(x):
    return x.permute(0, 2, 3, 1)


def tf_same_pads(size, k, stride, dilation=1):
    out = -(-size // stride)
    eff = (k - 1) * dilation + 1
    total = max((out - 1) * stride + eff - size, 0)
    return total // 2, total - total // 2


def pads4(hw, k, stride, dilation, padding):
    """(top, bottom, left, right) for Kiln's padding attribute."""
    if padding == "valid":
        return (0, 0, 0, 0)
    if padding == "same":
        return tf_same_pads(hw[0], k[0], stride[0], dilation[0]) + tf_same_pads(hw[1], k[1], stride[1], dilation[1])
    if isinstance(padding, int):
        return (padding,) * 4
    if len(padding) == 2:
        return (padding[0], padding[0], padding[1], padding[1])
    return tuple(padding)


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def conv2d(x, w, b=None, stride=1, padding="valid", dilation=1, groups=1, activation="none"):
    stride, dilation = _pair(stride), _pair(dilation)
    k = (w.shape[1], w.shape[2])
    t, bt, l, r = pads4((x.shape[1], x.shape[2]), k, stride, dilation, padding)
    xc = nchw(x)
    if t == bt and l == r:      # symmetric: let torch pad natively
        y = TF.conv2d(xc, w.permute(0, 3, 1, 2), b, stride, (t, l), dilation, groups)
    else:
        y = TF.conv2d(TF.pad(xc, (l, r, t, bt)), w.permute(0, 3, 1, 2), b, stride, 0, dilation, groups)
    return nhwc(act(y, activation))


def act(y, activation):
    if activation == "relu":
        return TF.relu(y)
    if activation == "relu6":
        return TF.relu6(y)
    return y


def avg_pool2d(x, pool=2, stride=None, padding="valid", count_include_pad=False):
    k = _pair(pool)
    s = _pair(stride) if stride is not None else k
    t, bt, l, r = pads4((x.shape[1], x.shape[2]), k, s, (1, 1), padding)
    xc = nchw(x)
    if t == bt and l == r and t <= k[0] // 2 and l <= k[1] // 2:
        # torch's own avg_pool2d; count_include_pad=False is TFLite's rule
        return nhwc(TF.avg_pool2d(xc, k, s, (t, l), count_include_pad=count_include_pad))
    sums = TF.avg_pool2d(TF.pad(xc, (l, r, t, bt)), k, s, divisor_override=1)
    if count_include_pad:
        return nhwc(sums / (k[0] * k[1]))
    ones = torch.ones((1, 1) + xc.shape[2:], dtype=x.dtype)
    counts = TF.avg_pool2d(TF.pad(ones, (l, r, t, bt)), k, s, divisor_override=1)
    return nhwc(sums / counts)


def _max_padded(x, k, s, padding):
    t, bt, l, r = pads4((x.shape[1], x.shape[2]), k, s, (1, 1), padding)
    return TF.pad(nchw(x), (l, r, t, bt), value=-np.inf), (t, bt, l, r)


def max_pool2d(x, pool=2, stride=None, padding="valid"):
    k = _pair(pool)
    s = _pair(stride) if stride is not None else k
    t, bt, l, r = pads4((x.shape[1], x.shape[2]), k, s, (1, 1), padding)
    if t == bt and l == r and t <= k[0] // 2 and l <= k[1] // 2:
        return nhwc(TF.max_pool2d(nchw(x), k, s, (t, l)))
    xp, _ = _max_padded(x, k, s, padding)
    return nhwc(TF.max_pool2d(xp, k, s))


def max_pool2d_gather(x, g, pool=2, stride=None, padding="valid"):
    """g (shaped like x) read at each window's argmax (the index torch's max_pool2d returns)."""
    k = _pair(pool)
    s = _pair(stride) if stride is not None else k
    xp, (t, bt, l, r) = _max_padded(x, k, s, padding)
    gp = TF.pad(nchw(g), (l, r, t, bt))
    _, idx = TF.max_pool2d(xp, k, s, return_indices=True)
    out = gp.flatten(2).gather(2, idx.flatten(2)).reshape(idx.shape)
    return nhwc(out)


def conv2d_grad_input(gy, w, input_shape, **kw):
    x = torch.zeros(tuple(input_shape), dtype=gy.dtype, requires_grad=True)
    return torch.autograd.grad(conv2d(x, w, **kw), x, gy, create_graph=True)[0]


def conv2d_grad_weight(x, gy, weight_shape, **kw):
    w = torch.zeros(tuple(weight_shape), dtype=gy.dtype, requires_grad=True)
    return torch.autograd.grad(conv2d(x, w, **kw), w, gy, create_graph=True)[0]


def avg_pool2d_grad(gy, input_shape, **kw):
    x = torch.zeros(tuple(input_shape), dtype=gy.dtype, requires_grad=True)
    return torch.autograd.grad(avg_pool2d(x, **kw), x, gy, create_graph=True)[0]


def max_pool2d_grad(x, gy, **kw):
    if not x.requires_grad:
        x = x.detach().requires_grad_(True)
    return torch.autograd.grad(max_pool2d(x, **kw), x, gy, create_graph=True)[0]
