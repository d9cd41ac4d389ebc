"""Optimisers and schedules against torch.optim on identical gradient sequences (float64)."""
import math

import numpy as np
import pytest
import torch

from kiln.training import SGD, Adam, AdamW, Schedule, make_optimizer
from kiln.training.optim import Optimizer

SHAPES = {"w": (3, 4), "b": (4,)}


def _run_both(make_kiln, make_torch, steps=6, lr_of=None):
    rng = np.random.default_rng(0)
    init = {k: rng.standard_normal(s) for k, s in SHAPES.items()}
    params = {k: v.copy() for k, v in init.items()}
    tparams = {k: torch.tensor(v.copy(), requires_grad=True) for k, v in init.items()}
    opt = make_kiln(params)
    topt = make_torch(list(tparams.values()))
    for t in range(steps):
        grads = {k: rng.standard_normal(s) for k, s in SHAPES.items()}
        if lr_of is not None:
            opt.lr = lr_of(t)
            for g in topt.param_groups:
                g["lr"] = lr_of(t)
        opt.step(grads)
        for k, p in tparams.items():
            p.grad = torch.tensor(grads[k])
        topt.step()
    for k in SHAPES:
        np.testing.assert_allclose(params[k], tparams[k].detach().numpy(), rtol=1e-6, atol=1e-6)
        assert np.max(np.abs(params[k] - tparams[k].detach().numpy())) < 1e-12
    return opt


CASES = {
    "sgd": (lambda p: SGD(p, 0.1), lambda tp: torch.optim.SGD(tp, 0.1)),
    "sgd-momentum": (lambda p: SGD(p, 0.1, momentum=0.9), lambda tp: torch.optim.SGD(tp, 0.1, momentum=0.9)),
    "sgd-dampening-wd": (lambda p: SGD(p, 0.05, momentum=0.8, dampening=0.3, weight_decay=1e-2),
                         lambda tp: torch.optim.SGD(tp, 0.05, momentum=0.8, dampening=0.3, weight_decay=1e-2)),
    "sgd-nesterov-wd": (lambda p: SGD(p, 0.1, momentum=0.9, nesterov=True, weight_decay=5e-3),
                        lambda tp: torch.optim.SGD(tp, 0.1, momentum=0.9, nesterov=True, weight_decay=5e-3)),
    "adam": (lambda p: Adam(p, 1e-2), lambda tp: torch.optim.Adam(tp, 1e-2)),
    "adam-wd": (lambda p: Adam(p, 1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
                lambda tp: torch.optim.Adam(tp, 1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
    "adamw": (lambda p: AdamW(p, 1e-2), lambda tp: torch.optim.AdamW(tp, 1e-2)),
    "adamw-wd": (lambda p: AdamW(p, 3e-2, weight_decay=0.3), lambda tp: torch.optim.AdamW(tp, 3e-2, weight_decay=0.3)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_optimizer_matches_torch(name):
    _run_both(*CASES[name])


@pytest.mark.parametrize("name", ["sgd-nesterov-wd", "adamw"])
def test_optimizer_with_changing_lr_matches_torch(name):
    _run_both(*CASES[name], lr_of=lambda t: 0.05 / (t + 1))


@pytest.mark.parametrize("name", ["sgd-momentum", "adam-wd", "adamw-wd"])
def test_state_dict_round_trip_continues_identically(name):
    make, _ = CASES[name]
    rng = np.random.default_rng(1)
    grads = [{k: rng.standard_normal(s) for k, s in SHAPES.items()} for _ in range(6)]
    a = {k: np.ones(s) for k, s in SHAPES.items()}
    oa = make(a)
    for g in grads:
        oa.step(g)
    b = {k: np.ones(s) for k, s in SHAPES.items()}
    ob = make(b)
    for g in grads[:3]:
        ob.step(g)
    sd = ob.state_dict()
    c = {k: v.copy() for k, v in b.items()}
    oc = make(c)
    oc.load_state_dict(sd)
    for g in grads[3:]:
        oc.step(g)
    for k in SHAPES:
        assert np.array_equal(a[k], c[k])


def test_explicit_accumulation_is_one_big_step():
    rng = np.random.default_rng(2)
    parts = [{k: rng.standard_normal(s) for k, s in SHAPES.items()} for _ in range(4)]
    a = {k: np.zeros(s) for k, s in SHAPES.items()}
    b = {k: np.zeros(s) for k, s in SHAPES.items()}
    oa, ob = Adam(a, 1e-2), Adam(b, 1e-2)
    oa.step({k: sum(p[k] for p in parts) / 4 for k in SHAPES})
    ob.zero_grad()
    for p in parts:
        ob.accumulate(p, 0.25)
    ob.step()
    assert ob.grad is None
    for k in SHAPES:
        np.testing.assert_allclose(a[k], b[k], atol=1e-12)


def test_optimizer_errors():
    p = {"w": np.zeros(3)}
    with pytest.raises(Exception, match="Nesterov"):
        SGD(p, 0.1, nesterov=True)
    with pytest.raises(Exception, match="without gradients"):
        SGD(p, 0.1).step()
    with pytest.raises(Exception, match="no gradient for parameters"):
        SGD(p, 0.1).step({})
    with pytest.raises(Exception, match="unknown optimizer"):
        make_optimizer("lbfgs", p, 0.1)
    with pytest.raises(Exception, match="is for 'adam'"):
        SGD(p, 0.1).load_state_dict(Adam(p).state_dict())


def _torch_lrs(make_sched, steps, base=0.1):
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], base)
    s = make_sched(opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        s.step()
    return out


def test_schedules_match_torch():
    S = torch.optim.lr_scheduler
    st = Schedule("step", 0.1, step_size=3, gamma=0.5)
    assert [st(t) for t in range(10)] == pytest.approx(_torch_lrs(lambda o: S.StepLR(o, 3, 0.5), 10), rel=1e-12)
    cos = Schedule("cosine", 0.1, total=8, min_lr=0.01)
    want = _torch_lrs(lambda o: S.CosineAnnealingLR(o, 8, eta_min=0.01), 9)
    assert [cos(t) for t in range(9)] == pytest.approx(want, rel=1e-9)
    assert cos(20) == pytest.approx(0.01)
    warm = Schedule("constant", 0.1, warmup=4)
    assert [warm(t) for t in range(6)] == pytest.approx([0.025, 0.05, 0.075, 0.1, 0.1, 0.1])
    wc = Schedule("cosine", 0.1, total=10, warmup=2)
    assert wc(1) == pytest.approx(0.1) and wc(2) == pytest.approx(0.1)
    assert wc(7) == pytest.approx(0.05 * (1 + math.cos(math.pi * 5 / 10)))
    assert Schedule.from_config(wc.config()).config() == wc.config()
    with pytest.raises(Exception, match="unknown schedule"):
        Schedule("exp", 0.1)


def test_optimizer_is_the_base_class():
    assert all(issubclass(c, Optimizer) for c in (SGD, Adam, AdamW))
