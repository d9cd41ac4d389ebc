"""Data: in-memory datasets, a seeded DataLoader with augmentations, scikit-learn's 8x8 digits,
user data in .npz files, and a synthetic stand-in for datasets Kiln cannot ship.

The DataLoader draws everything random (the epoch's permutation, augmentation noise) from its
own ``numpy.random.Generator``; ``state_dict()`` saves that generator's full bit-generator state
together with the current epoch's permutation and position, so a resumed run draws exactly the
batches the interrupted one would have drawn.
"""
from __future__ import annotations

import dataclasses
import os
import zipfile

import numpy as np

from kiln.frontend.errors import KilnError


class DataError(KilnError):
    """A dataset could not be loaded or does not fit the model."""


@dataclasses.dataclass
class ArrayDataset:
    """Inputs ``x`` [N, ...] and targets ``y`` [N, ...] (int64 labels or float targets; ``None``
    when the target is the input itself, as for autoencoders)."""
    x: np.ndarray
    y: np.ndarray | None = None
    name: str = "data"
    num_classes: int | None = None

    def __post_init__(self):
        self.x = np.asarray(self.x)
        if self.y is not None:
            self.y = np.asarray(self.y)
            if len(self.y) != len(self.x):
                raise DataError(f"dataset {self.name!r}: {len(self.x)} inputs but {len(self.y)} targets")
            if self.y.dtype.kind in "iu":
                self.y = self.y.astype(np.int64)
                if self.num_classes is None and len(self.y):
                    self.num_classes = int(self.y.max()) + 1

    def __len__(self):
        return len(self.x)

    def check_finite(self, chunk=4096):
        """Raise DataError naming the samples whose inputs or float targets hold NaN/Inf."""
        for what, a in (("inputs", self.x), ("targets", self.y)):
            if a is None or a.dtype.kind not in "fc" or not len(a):
                continue
            bad = [i + int(j) for i in range(0, len(a), chunk)
                   for j in np.flatnonzero(~np.isfinite(a[i:i + chunk].reshape(min(chunk, len(a) - i), -1)).all(axis=1))]
            if bad:
                raise DataError(f"dataset {self.name!r}: the {what} of {len(bad)} of {len(a)} samples hold NaN/Inf "
                                f"(sample indices {bad[:8]}{' ...' if len(bad) > 8 else ''}): clean or drop them")

    def subset(self, idx):
        return ArrayDataset(self.x[idx], None if self.y is None else self.y[idx], self.name, self.num_classes)


# ---- augmentations: f(x_batch, rng) -> x_batch (float NHWC) --------------------------------------
class RandomShift:
    """Shift each image by up to ``max_shift`` pixels in H and W (zero fill)."""

    def __init__(self, max_shift=1):
        self.max_shift = int(max_shift)

    def __call__(self, x, rng):
        s = self.max_shift
        if s == 0 or x.ndim != 4:
            return x
        n, h, w, _ = x.shape
        offs = rng.integers(-s, s + 1, size=(n, 2))
        xp = np.pad(x, ((0, 0), (s, s), (s, s), (0, 0)))
        out = np.empty_like(x)
        for dy in range(-s, s + 1):          # one slice per distinct offset, not per image
            for dx in range(-s, s + 1):
                sel = np.flatnonzero((offs[:, 0] == dy) & (offs[:, 1] == dx))
                if len(sel):
                    out[sel] = xp[sel, s - dy:s - dy + h, s - dx:s - dx + w]
        return out

    def __repr__(self):
        return f"RandomShift({self.max_shift})"


class GaussianNoise:
    def __init__(self, std=0.05):
        self.std = float(std)

    def __call__(self, x, rng):
        return (x + rng.normal(0.0, self.std, size=x.shape)).astype(x.dtype)

    def __repr__(self):
        return f"GaussianNoise({self.std})"


def parse_augment(spec):
    """'shift:1,noise:0.05' -> [RandomShift(1), GaussianNoise(0.05)] ('' or 'none': [])."""
    out = []
    for part in (spec or "").split(","):
        part = part.strip()
        if not part or part == "none":
            continue
        name, _, arg = part.partition(":")
        if name == "shift":
            out.append(RandomShift(int(arg or 1)))
        elif name == "noise":
            out.append(GaussianNoise(float(arg or 0.05)))
        else:
            raise DataError(f"unknown augmentation {name!r} in {spec!r}; known: shift[:PIXELS], noise[:STD]")
    return out


# ---- loader ------------------------------------------------------------------------------------
class DataLoader:
    """Batches of (x, y) in a seeded order. ``next_batch()`` returns the next batch of the current
    epoch or ``None`` at its end (the following call starts a new epoch); iterating yields one
    epoch. Augmentations run on each batch with the loader's generator."""

    def __init__(self, dataset: ArrayDataset, batch_size=32, shuffle=True, drop_last=False, seed=0,
                 augment=(), dtype=None):
        if batch_size < 1:
            raise DataError(f"batch_size must be >= 1, got {batch_size}")
        if drop_last and len(dataset) < batch_size:
            raise DataError(f"dataset {dataset.name!r} has {len(dataset)} samples, fewer than one batch "
                            f"of {batch_size} with drop_last")
        self.dataset, self.batch_size = dataset, int(batch_size)
        self.shuffle, self.drop_last = bool(shuffle), bool(drop_last)
        self.augment = list(augment or [])
        self.dtype = dtype
        self.rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        self.epoch = 0
        self.perm = None
        self.pos = 0

    def __len__(self):
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _start_epoch(self):
        n = len(self.dataset)
        self.perm = self.rng.permutation(n) if self.shuffle else np.arange(n)
        self.pos = 0

    def next_batch(self):
        if self.perm is None:
            self._start_epoch()
        if self.pos >= len(self):
            self.perm = None
            self.epoch += 1
            return None
        idx = self.perm[self.pos * self.batch_size:(self.pos + 1) * self.batch_size]
        self.pos += 1
        x = self.dataset.x[idx]
        if self.dtype is not None and x.dtype.kind == "f":
            x = x.astype(self.dtype)
        for aug in self.augment:
            x = aug(x, self.rng)
        y = None if self.dataset.y is None else self.dataset.y[idx]
        if y is not None and self.dtype is not None and y.dtype.kind == "f":
            y = y.astype(self.dtype)
        return x, y

    def __iter__(self):
        while (b := self.next_batch()) is not None:
            yield b

    def state_dict(self):
        return {"rng": self.rng.bit_generator.state, "epoch": self.epoch, "pos": self.pos,
                "perm": None if self.perm is None else self.perm.copy()}

    def load_state_dict(self, sd):
        self.rng.bit_generator.state = sd["rng"]
        self.epoch, self.pos = int(sd["epoch"]), int(sd["pos"])
        self.perm = None if sd.get("perm") is None else np.asarray(sd["perm"], np.int64)
        if self.perm is not None and len(self.perm) != len(self.dataset):
            raise DataError(f"loader state holds a permutation of {len(self.perm)} samples, the dataset "
                            f"has {len(self.dataset)}: resume with the same data")


# ---- datasets ----------------------------------------------------------------------------------
def digits(test_fraction=0.2):
    """scikit-learn's bundled 8x8 digits (1,797 images, 10 classes) as (train, test) datasets:
    images NHWC float32 [N, 8, 8, 1] scaled from 0..16 to [0, 1], labels int64. The split is
    fixed (stratified, ``random_state=0``): 1,437 training and 360 test images by default."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    d = load_digits()
    x = (d.images.astype(np.float32) / 16.0)[..., None]
    y = d.target.astype(np.int64)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=test_fraction, random_state=0, stratify=y)
    return (ArrayDataset(xtr, ytr, "digits-train", 10), ArrayDataset(xte, yte, "digits-test", 10))


def load_npz(path):
    """User data in an .npz: arrays ``x_train``, ``y_train`` and optionally ``x_test``, ``y_test``
    (or just ``x``, ``y``: then everything is training data). Inputs are float arrays [N, ...]
    (NHWC for images); targets are int class labels [N] or float arrays; ``y`` may be omitted
    for autoencoders. Returns (train, test or None)."""
    if not os.path.exists(path):
        raise DataError(f"data file {path} not found")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrs = {k: z[k] for k in z.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise DataError(f"{path}: not a readable .npz ({type(e).__name__}: {e})") from None
    base = os.path.basename(path)
    if "x_train" in arrs:
        train = ArrayDataset(arrs["x_train"], arrs.get("y_train"), f"{base}:train")
        test = (ArrayDataset(arrs["x_test"], arrs.get("y_test"), f"{base}:test")
                if "x_test" in arrs else None)
    elif "x" in arrs:
        train, test = ArrayDataset(arrs["x"], arrs.get("y"), base), None
    else:
        raise DataError(f"{path}: expected arrays x_train/y_train[/x_test/y_test] or x/y, found {sorted(arrs)}")
    for ds in (train, test):
        if ds is not None and ds.x.dtype.kind not in "fiu":
            raise DataError(f"{path}: inputs must be numeric, got {ds.x.dtype}")
        if ds is not None and ds.x.dtype.kind != "f":
            ds.x = ds.x.astype(np.float32)
    if test is not None and test.num_classes and train.num_classes:
        test.num_classes = train.num_classes = max(test.num_classes, train.num_classes)
    return train, test


def synthetic(input_shape, num_classes=None, n_train=512, n_test=128, seed=0, target="labels"):
    """A learnable stand-in for datasets Kiln cannot ship (speech commands, CIFAR-10, visual wake
    words, ToyADMOS): Gaussian inputs of ``input_shape`` (per sample) with labels from a fixed
    random linear map, or no targets (``target='input'``, autoencoders)."""
    rng = np.random.default_rng(seed)
    n = n_train + n_test
    x = rng.standard_normal((n,) + tuple(input_shape)).astype(np.float32)
    y = None
    if target == "labels":
        w = rng.standard_normal((int(np.prod(input_shape)), num_classes))
        y = np.argmax(x.reshape(n, -1) @ w, axis=1).astype(np.int64)
    train = ArrayDataset(x[:n_train], None if y is None else y[:n_train], "synthetic-train", num_classes)
    test = ArrayDataset(x[n_train:], None if y is None else y[n_train:], "synthetic-test", num_classes)
    return train, test
