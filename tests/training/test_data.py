"""DataLoader (seeded order, batching, drop_last, augmentation, exact resume), digits, .npz data."""
import numpy as np
import pytest

import kiln.data
from kiln.training.data import (
    ArrayDataset,
    DataError,
    DataLoader,
    GaussianNoise,
    RandomShift,
    load_npz,
    parse_augment,
    synthetic,
)


def _ds(n=10):
    return ArrayDataset(np.arange(n, dtype=np.float32).reshape(n, 1), np.arange(n) % 3)


def test_batches_cover_the_data_in_a_seeded_order():
    ds = _ds(10)
    a = [x[:, 0].tolist() for x, _ in DataLoader(ds, 4, seed=1)]
    b = [x[:, 0].tolist() for x, _ in DataLoader(ds, 4, seed=1)]
    c = [x[:, 0].tolist() for x, _ in DataLoader(ds, 4, seed=2)]
    assert a == b and a != c
    assert [len(v) for v in a] == [4, 4, 2]
    assert sorted(sum(a, [])) == list(range(10))
    loader = DataLoader(ds, 4, seed=1)
    e1 = [x[:, 0].tolist() for x, _ in loader]
    e2 = [x[:, 0].tolist() for x, _ in loader]
    assert e1 == a and e1 != e2 and loader.epoch == 2          # a new permutation every epoch
    assert [x[:, 0].tolist() for x, _ in DataLoader(ds, 4, shuffle=False)][0] == [0, 1, 2, 3]


def test_drop_last_and_len():
    ds = _ds(10)
    assert len(DataLoader(ds, 4)) == 3 and len(DataLoader(ds, 4, drop_last=True)) == 2
    assert [len(x) for x, _ in DataLoader(ds, 4, drop_last=True)] == [4, 4]
    with pytest.raises(DataError, match="fewer than one batch"):
        DataLoader(ds, 20, drop_last=True)


def test_state_dict_resumes_mid_epoch_exactly():
    ds = ArrayDataset(np.random.default_rng(0).random((23, 4, 4, 1)).astype(np.float32), np.arange(23))
    aug = [RandomShift(1), GaussianNoise(0.1)]
    a = DataLoader(ds, 5, seed=3, augment=aug)
    want = [b for _ in range(3) for b in a]
    b = DataLoader(ds, 5, seed=3, augment=aug)
    got = [next(iter(b)) for _ in range(2)]      # two batches of epoch 1
    sd = b.state_dict()
    c = DataLoader(ds, 5, seed=99, augment=aug)
    c.load_state_dict(sd)
    got += list(c) + [x for _ in range(2) for x in c]
    assert len(got) == len(want)
    for (x1, y1), (x2, y2) in zip(got, want):
        assert np.array_equal(x1, x2) and np.array_equal(y1, y2)


def test_augmentations():
    rng = np.random.default_rng(0)
    x = np.zeros((50, 5, 5, 1), np.float32)
    x[:, 2, 2, 0] = 1.0
    y = RandomShift(1)(x, rng)
    assert y.shape == x.shape and np.all(y.sum(axis=(1, 2, 3)) == 1.0)
    pos = {tuple(np.argwhere(img[..., 0] == 1)[0]) for img in y}
    assert pos <= {(r, c) for r in (1, 2, 3) for c in (1, 2, 3)} and len(pos) > 3
    n = GaussianNoise(0.5)(x, rng)
    assert n.dtype == np.float32 and 0.3 < float(np.std(n - x)) < 0.7
    assert [repr(a) for a in parse_augment("shift:2,noise:0.1")] == ["RandomShift(2)", "GaussianNoise(0.1)"]
    assert parse_augment("none") == [] and parse_augment("") == []
    with pytest.raises(DataError, match="unknown augmentation"):
        parse_augment("rotate:5")


def test_digits_fixed_split():
    tr, te = kiln.data.digits()
    assert tr.x.shape == (1437, 8, 8, 1) and te.x.shape == (360, 8, 8, 1)
    assert tr.x.dtype == np.float32 and tr.y.dtype == np.int64
    assert 0.0 <= tr.x.min() and tr.x.max() <= 1.0 and tr.x.max() == 1.0
    assert tr.num_classes == te.num_classes == 10
    tr2, te2 = kiln.data.digits()
    assert np.array_equal(te.x, te2.x) and np.array_equal(te.y, te2.y)
    assert np.bincount(te.y).min() >= 35           # stratified


def test_load_npz_formats_and_errors(tmp_path):
    rng = np.random.default_rng(0)
    p = tmp_path / "d.npz"
    np.savez(p, x_train=rng.random((8, 3)), y_train=np.arange(8) % 2, x_test=rng.random((4, 3)), y_test=[0, 1, 2, 1])
    tr, te = load_npz(str(p))
    assert len(tr) == 8 and len(te) == 4 and tr.num_classes == te.num_classes == 3
    np.savez(p, x=np.ones((5, 2), np.uint8))
    tr, te = load_npz(str(p))
    assert te is None and tr.y is None and tr.x.dtype == np.float32
    np.savez(p, images=np.ones(3))
    with pytest.raises(DataError, match="expected arrays x_train"):
        load_npz(str(p))
    np.savez(p, x=np.ones(3), y=np.ones(4))
    with pytest.raises(DataError, match="3 inputs but 4 targets"):
        load_npz(str(p))
    p.write_bytes(b"garbage")
    with pytest.raises(DataError, match="not a readable .npz"):
        load_npz(str(p))
    with pytest.raises(DataError, match="not found"):
        load_npz(str(tmp_path / "none.npz"))


def test_synthetic():
    tr, te = synthetic((4, 4, 2), 5, n_train=40, n_test=10)
    assert tr.x.shape == (40, 4, 4, 2) and te.y.shape == (10,) and tr.num_classes == 5
    tr, te = synthetic((16,), target="input", n_train=8, n_test=2)
    assert tr.y is None
