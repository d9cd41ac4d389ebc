"""Module API and the standard layers, against torch.nn (NHWC here, NCHW there)."""
import numpy as np
import pytest
import torch

import kiln.frontend as kf
from kiln.autodiff import grad, to_float64
from kiln.frontend import functional as F
from kiln.frontend.errors import KilnError
from kiln.frontend.types import TensorType

RNG = np.random.default_rng(0)


def nchw(x):
    return torch.tensor(x).permute(0, 3, 1, 2)


def to_nhwc(t):
    return t.detach().permute(0, 2, 3, 1).numpy()


class Block(kf.Module):
    def __init__(self):
        self.convs = [kf.Conv2d(2, 4, 3, padding="same"), kf.Conv2d(4, 4, 1)]
        self.heads = {"a": kf.Linear(4, 3), "b": kf.Linear(4, 2, bias=False)}
        self.bn = kf.BatchNorm2d(4)
        self.scale = kf.Parameter(np.ones(4))
        self.drop = kf.Dropout(0.5)
        self.note = "not a tensor"

    def forward(self, x):
        for c in self.convs:
            x = F.relu(c(x))
        x = self.drop(self.bn(x) * self.scale)
        x = F.mean(x, [1, 2])
        return F.concat([self.heads["a"](x), self.heads["b"](x)], 1)


def test_parameters_discovered_through_attributes_lists_and_dicts():
    m = Block()
    names = [n for n, _ in m.named_parameters()]
    # torch's order: a module's own parameters first, then its children's in attribute order
    assert names == ["scale", "convs.0.weight", "convs.0.bias", "convs.1.weight", "convs.1.bias",
                     "heads.a.weight", "heads.a.bias", "heads.b.weight", "bn.weight", "bn.bias"]
    assert [n for n, _ in m.named_buffers()] == ["bn.running_mean", "bn.running_var"]
    assert [n for n, _ in m.named_modules()] == ["", "convs.0", "convs.1", "heads.a", "heads.b", "bn", "drop"]
    assert len(m.parameters()) == len(names)


def test_shared_module_and_parameter_are_listed_once():
    lin = kf.Linear(3, 3)
    seq = kf.Sequential(lin, kf.ReLU(), lin)
    assert [n for n, _ in seq.named_parameters()] == ["0.weight", "0.bias"]
    assert [n for n, _ in seq.named_modules()] == ["", "0", "1"]


def test_train_eval_recursive_into_lists_and_dicts():
    m = Block()
    m.eval()
    assert not any(mod.training for mod in m.modules())
    m.train()
    assert all(mod.training for mod in m.modules())
    assert m.heads["b"].training and m.convs[1].training


def test_traced_graph_uses_dotted_names():
    m = Block().eval()
    g = kf.trace(m, (2, 5, 5, 2))
    assert set(g.params) == {n for n, _ in m.named_parameters()}
    assert set(g.consts) >= {"bn.running_mean", "bn.running_var"}
    assert "dropout_key" not in g.inputs          # dropout is the identity in eval mode
    y = kf.run(g, RNG.standard_normal((2, 5, 5, 2)).astype(np.float32))[0]
    assert y.shape == (2, 5)


def test_state_dict_round_trip_and_strict_errors():
    a, b = Block(), Block()
    b.load_state_dict(a.state_dict())
    for (n, p), (_, q) in zip(a.named_parameters() + a.named_buffers(), b.named_parameters() + b.named_buffers()):
        np.testing.assert_array_equal(p.data, q.data, err_msg=n)
    sd = a.state_dict()
    sd["convs.0.weight"] = np.zeros((1, 2, 3))
    del sd["scale"]
    sd["extra.weight"] = np.zeros(3)
    with pytest.raises(KilnError) as e:
        b.load_state_dict(sd)
    msg = str(e.value)
    assert "missing keys: ['scale']" in msg
    assert "unexpected keys: ['extra.weight']" in msg
    assert "convs.0.weight: expected (4, 3, 3, 2), got (1, 2, 3)" in msg
    # non-strict tolerates missing/unexpected keys but never a shape mismatch
    with pytest.raises(KilnError, match="mis-shaped"):
        b.load_state_dict(sd, strict=False)
    del sd["convs.0.weight"]
    res = b.load_state_dict(sd, strict=False)
    assert res["missing"] == ["scale", "convs.0.weight"] and res["unexpected"] == ["extra.weight"]


def test_state_dict_is_a_copy():
    lin = kf.Linear(2, 2)
    sd = lin.state_dict()
    sd["weight"][:] = 7
    assert not np.any(lin.weight.data == 7)


def _torch_linear(lin):
    t = torch.nn.Linear(lin.in_features, lin.out_features, bias=lin.bias is not None).double()
    with torch.no_grad():
        t.weight.copy_(torch.tensor(lin.weight.data))
        if lin.bias is not None:
            t.bias.copy_(torch.tensor(lin.bias.data))
    return t


def test_linear_matches_torch_forward_and_grads():
    kf.manual_seed(1)
    lin = kf.Linear(5, 3)
    x = RNG.standard_normal((4, 5))
    g = to_float64(kf.trace(lin, (4, 5)))
    t = _torch_linear(lin)
    tx = torch.tensor(x, requires_grad=True)
    ty = t(tx)
    np.testing.assert_allclose(kf.run(g, x)[0], ty.detach().numpy(), rtol=1e-12)
    gs = g.copy()
    from kiln.frontend.tensor import Tensor
    gs.outputs = [F.sum(Tensor(gs, gs.outputs[0]) ** 2.0).name]
    gg = grad(gs, wrt=["x", "weight", "bias"])
    gx, gw, gb = kf.run(gg, x)
    tgx, tgw, tgb = torch.autograd.grad((ty ** 2).sum(), [tx, t.weight, t.bias])
    for a, b in ((gx, tgx), (gw, tgw), (gb, tgb)):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("cin,cout,k,stride,padding,groups", [
    (3, 4, 3, 1, "valid", 1), (4, 6, 3, 2, "same", 2), (3, 3, 3, 1, "same", 3), (2, 4, (3, 1), 1, 1, 1)])
def test_conv2d_layer_matches_torch(cin, cout, k, stride, padding, groups):
    conv = kf.Conv2d(cin, cout, k, stride=stride, padding=padding, groups=groups)
    assert conv.weight.shape[3] == cin // groups
    x = RNG.standard_normal((2, 7, 6, cin)).astype(np.float32)
    y = kf.run(kf.trace(conv, x.shape), x)[0]
    tw = torch.tensor(conv.weight.data).permute(0, 3, 1, 2)
    xt = nchw(x)
    if padding == "same":
        kh, kw = (k, k) if isinstance(k, int) else k
        ph = max((-(-7 // stride) - 1) * stride + kh - 7, 0)
        pw = max((-(-6 // stride) - 1) * stride + kw - 6, 0)
        xt = torch.nn.functional.pad(xt, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2))
        tp = 0
    else:
        tp = 0 if padding == "valid" else padding
    want = torch.nn.functional.conv2d(xt, tw, torch.tensor(conv.bias.data), stride, tp, 1, groups)
    np.testing.assert_allclose(y, to_nhwc(want), rtol=1e-5, atol=1e-5)


def _torch_bn(bn):
    t = torch.nn.BatchNorm2d(bn.num_features, eps=bn.eps, momentum=bn.momentum).double()
    with torch.no_grad():
        t.weight.copy_(torch.tensor(bn.weight.data))
        t.bias.copy_(torch.tensor(bn.bias.data))
        t.running_mean.copy_(torch.tensor(bn.running_mean.data))
        t.running_var.copy_(torch.tensor(bn.running_var.data))
    return t


def test_batchnorm_train_mode_matches_torch_including_running_stats_and_grads():
    bn = kf.BatchNorm2d(3, momentum=0.2).to("float64")
    bn.weight.data[:] = [1.0, 2.0, 0.5]
    bn.bias.data[:] = [0.1, -0.2, 0.3]
    tb = _torch_bn(bn).train()
    for step in range(3):   # several steps: running stats accumulate like torch's
        x = RNG.standard_normal((4, 5, 3, 3)) * (step + 1) + step
        g = kf.trace(bn, TensorType(x.shape, "float64"))
        (y,), upd = kf.run_updates(g, x)
        xt = nchw(x).requires_grad_(True)
        ty = tb(xt)
        np.testing.assert_allclose(y, to_nhwc(ty), rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(upd["running_mean"], tb.running_mean.numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(upd["running_var"], tb.running_var.numpy(), rtol=1e-10, atol=1e-12)
        bn.load_state_dict(upd, strict=False)
    # gradients through the batch statistics
    u = RNG.standard_normal(y.shape)
    from kiln.autodiff import vjp
    g64 = kf.trace(bn, TensorType(x.shape, "float64"))
    gv = vjp(g64, wrt=["x", "weight", "bias"])
    gx, gw, gb = kf.run(gv, x, u)
    tb2 = _torch_bn(bn).train()
    xt = nchw(x).requires_grad_(True)
    txg, twg, tbg = torch.autograd.grad(tb2(xt), [xt, tb2.weight, tb2.bias], torch.tensor(u).permute(0, 3, 1, 2))
    np.testing.assert_allclose(gx, to_nhwc(txg), rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(gw, twg.numpy(), rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(gb, tbg.numpy(), rtol=1e-9, atol=1e-10)


def test_batchnorm_eval_mode_uses_running_stats_like_torch():
    bn = kf.BatchNorm2d(2)
    bn.running_mean.data[:] = [0.5, -1.0]
    bn.running_var.data[:] = [2.0, 0.25]
    bn.weight.data[:] = [1.5, 0.5]
    bn.eval()
    x = RNG.standard_normal((3, 4, 4, 2)).astype(np.float32)
    g = kf.trace(bn, x.shape)
    assert not g.updates
    y = kf.run(g, x)[0]
    tb = _torch_bn(bn).float().eval()
    np.testing.assert_allclose(y, to_nhwc(tb(nchw(x))), rtol=1e-5, atol=1e-6)


def test_dropout_train_only_and_mask_follows_key():
    d = kf.Dropout(0.5)
    x = np.ones((8, 16), np.float32)
    g = kf.trace(d, x.shape)
    assert "dropout_key" in g.inputs
    a = kf.run(g, x, np.int64(1))[0]
    b = kf.run(g, x, np.int64(1))[0]
    c = kf.run(g, x, np.int64(2))[0]
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert set(np.unique(a)) <= {0.0, 2.0}
    assert 0.3 < (a == 0).mean() < 0.7
    d.eval()
    ge = kf.trace(d, x.shape)
    assert ge.nodes == [] and "dropout_key" not in ge.inputs
    np.testing.assert_array_equal(kf.run(ge, x)[0], x)


def test_pool_flatten_sequential_match_torch():
    kf.manual_seed(3)
    model = kf.Sequential(kf.Conv2d(3, 4, 3, padding="same", activation="relu"), kf.ReLU6(),
                          kf.MaxPool2d(2), kf.AvgPool2d(2, 1), kf.Flatten(), kf.Linear(4 * 2 * 2, 3))
    tm = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.ReLU6(),
                             torch.nn.MaxPool2d(2), torch.nn.AvgPool2d(2, 1))
    with torch.no_grad():
        tm[0].weight.copy_(torch.tensor(model[0].weight.data).permute(0, 3, 1, 2))
        tm[0].bias.copy_(torch.tensor(model[0].bias.data))
    x = RNG.standard_normal((2, 6, 6, 3)).astype(np.float32) * 3
    y = kf.run(kf.trace(model, x.shape), x)[0]
    h = tm(nchw(x)).permute(0, 2, 3, 1).reshape(2, -1)     # flatten in NHWC order
    want = torch.nn.functional.linear(h, torch.tensor(model[5].weight.data), torch.tensor(model[5].bias.data))
    np.testing.assert_allclose(y, want.detach().numpy(), rtol=1e-5, atol=1e-5)
    assert len(model) == 6 and isinstance(model[2], kf.MaxPool2d)


def test_global_avg_pool():
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    y = kf.run(kf.trace(kf.GlobalAvgPool(), x.shape), x)[0]
    np.testing.assert_allclose(y, x.astype(np.float64).mean((1, 2)), rtol=1e-6, atol=1e-7)   # float64 sums, rounded once


def test_avgpool_layer_excludes_padding_by_default():
    x = np.ones((1, 3, 3, 1), np.float32)
    y = kf.run(kf.trace(kf.AvgPool2d(2, 2, "same"), x.shape), x)[0]
    np.testing.assert_array_equal(y, np.ones((1, 2, 2, 1)))   # TFLite: padding does not dilute


def test_module_without_forward_names_itself():
    class Empty(kf.Module):
        pass
    with pytest.raises(NotImplementedError, match="Empty.forward"):
        kf.trace(Empty(), (2,))


def test_repr_lists_children():
    s = repr(kf.Sequential(kf.Linear(2, 3), kf.ReLU()))
    assert "(0): Linear(2, 3)" in s and "(1): ReLU()" in s
