"""The model zoo: MLPerf Tiny reference architectures and the digits demo CNN, written with Kiln's
Module API (NHWC). ``get(name)`` returns a :class:`ZooModel` ``(module, input_shape, dataset,
loss)``; ``input_shape`` includes a batch of 1.

| name | task | input | notes |
|---|---|---|---|
| ds-cnn | keyword spotting (MLPerf Tiny) | [1,49,10,1] MFCC | conv 10x4/2 64 + 4 depthwise-separable blocks, 12 classes |
| resnet8 | image classification (MLPerf Tiny) | [1,32,32,3] | 3 residual stages 16/32/64, 10 classes |
| mobilenet-v1-0.25 | visual wake words (MLPerf Tiny) | [1,96,96,3] | MobileNet v1, width 0.25, 2 classes |
| fc-autoencoder | anomaly detection (MLPerf Tiny) | [1,640] | 640-128x4-8-128x4-640 dense + BN + relu |
| digits-cnn | 8x8 digits demo | [1,8,8,1] | conv 3x3 8, conv 3x3 16, max pool 2, dense 10: 3,818 parameters |

Only the digits have a bundled dataset; the others default to ``synthetic`` data of the right
shape (pass real data as an .npz with ``kiln train --data``).
"""
from __future__ import annotations

import importlib.util
import os
from typing import NamedTuple

from kiln.frontend import functional as F
from kiln.frontend import module as M
from kiln.frontend.errors import KilnError, UsageError
from kiln.frontend.graph_module import GraphModule
from kiln.frontend.loader import load_model


class ZooModel(NamedTuple):
    module: M.Module
    input_shape: tuple
    dataset: str          # "digits", "synthetic" or a path to an .npz
    loss: str             # a name from kiln.training.losses.LOSSES
    num_classes: int | None = None


class ConvBN(M.Module):
    """conv (or depthwise conv) + BatchNorm + activation."""

    def __init__(self, cin, cout, k, stride=1, groups=1, act="relu"):
        self.conv = M.Conv2d(cin, cout, k, stride=stride, padding="same", groups=groups)
        self.bn = M.BatchNorm2d(cout)
        self.act = act

    def forward(self, x):
        y = self.bn(self.conv(x))
        return {"relu": F.relu, "relu6": F.relu6, "none": lambda t: t}[self.act](y)


class DSCNN(M.Module):
    """MLPerf Tiny keyword spotting DS-CNN (with its dropout 0.2 / 0.4)."""

    def __init__(self, classes=12, ch=64):
        self.stem = ConvBN(1, ch, (10, 4), stride=2)
        self.drop1 = M.Dropout(0.2)
        self.blocks = [M.Sequential(ConvBN(ch, ch, 3, groups=ch), ConvBN(ch, ch, 1)) for _ in range(4)]
        self.drop2 = M.Dropout(0.4)
        self.fc = M.Linear(ch, classes)

    def forward(self, x):
        x = self.drop1(self.stem(x))
        for b in self.blocks:
            x = b(x)
        return self.fc(F.mean(self.drop2(x), [1, 2]))


class ResBlock(M.Module):
    def __init__(self, cin, cout, stride):
        self.a = ConvBN(cin, cout, 3, stride=stride)
        self.b = ConvBN(cout, cout, 3, act="none")
        self.short = M.Conv2d(cin, cout, 1, stride=stride) if (stride != 1 or cin != cout) else None

    def forward(self, x):
        s = x if self.short is None else self.short(x)
        return F.relu(self.b(self.a(x)) + s)


class ResNet8(M.Module):
    """MLPerf Tiny image classification ResNet-8 (CIFAR-10)."""

    def __init__(self, classes=10):
        self.stem = ConvBN(3, 16, 3)
        self.stages = [ResBlock(16, 16, 1), ResBlock(16, 32, 2), ResBlock(32, 64, 2)]
        self.fc = M.Linear(64, classes)

    def forward(self, x):
        x = self.stem(x)
        for s in self.stages:
            x = s(x)
        return self.fc(F.mean(x, [1, 2]))


class MobileNetV1(M.Module):
    """MobileNet v1 (ReLU6) with a width multiplier; MLPerf Tiny visual wake words uses 0.25."""
    CFG = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2)] + [(512, 1)] * 5 + [(1024, 2), (1024, 1)]

    def __init__(self, classes=2, alpha=0.25):
        c = int(32 * alpha)
        self.stem = ConvBN(3, c, 3, stride=2, act="relu6")
        blocks = []
        for out, stride in self.CFG:
            o = int(out * alpha)
            blocks.append(M.Sequential(ConvBN(c, c, 3, stride=stride, groups=c, act="relu6"),
                                       ConvBN(c, o, 1, act="relu6")))
            c = o
        self.blocks = blocks
        self.fc = M.Linear(c, classes)

    def forward(self, x):
        x = self.stem(x)
        for b in self.blocks:
            x = b(x)
        return self.fc(F.mean(x, [1, 2]))


class DenseBN(M.Module):
    def __init__(self, cin, cout):
        self.fc = M.Linear(cin, cout)
        self.bn = M.BatchNorm2d(cout)

    def forward(self, x):
        return F.relu(self.bn(self.fc(x)))


class FCAutoencoder(M.Module):
    """MLPerf Tiny anomaly detection autoencoder: 640 -> 128x4 -> 8 -> 128x4 -> 640."""

    def __init__(self, dim=640, hidden=128, bottleneck=8):
        sizes = [dim] + [hidden] * 4 + [bottleneck] + [hidden] * 4
        self.layers = [DenseBN(a, b) for a, b in zip(sizes[:-1], sizes[1:])]
        self.out = M.Linear(hidden, dim)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.out(x)


def digits_cnn():
    """The 8x8 digits demo CNN: conv 3x3 8 + relu, conv 3x3 16 + relu, max pool 2x2, dense 10
    (3,818 parameters, 81k MACs; int8-friendly: fused ReLUs, no BatchNorm). Max pooling instead
    of a stride-2 conv: same parameters, 98-99% instead of 95-98.5% test accuracy over seeds."""
    return M.Sequential(M.Conv2d(1, 8, 3, padding="same", activation="relu"),
                        M.Conv2d(8, 16, 3, padding="same", activation="relu"),
                        M.MaxPool2d(2), M.Flatten(), M.Linear(4 * 4 * 16, 10))


_ZOO = {
    "ds-cnn": lambda: ZooModel(DSCNN(), (1, 49, 10, 1), "synthetic", "cross_entropy", 12),
    "resnet8": lambda: ZooModel(ResNet8(), (1, 32, 32, 3), "synthetic", "cross_entropy", 10),
    "mobilenet-v1-0.25": lambda: ZooModel(MobileNetV1(), (1, 96, 96, 3), "synthetic", "cross_entropy", 2),
    "fc-autoencoder": lambda: ZooModel(FCAutoencoder(), (1, 640), "synthetic", "mse_reconstruction", None),
    "digits-cnn": lambda: ZooModel(digits_cnn(), (1, 8, 8, 1), "digits", "cross_entropy", 10),
}


def names():
    return list(_ZOO)


def get(name) -> ZooModel:
    """A fresh model (initialised from the generator seeded by ``kiln.frontend.manual_seed``)."""
    if name not in _ZOO:
        raise UsageError(f"unknown zoo model {name!r}; known: {', '.join(_ZOO)} (or pass a path to a .py file)")
    return _ZOO[name]()


MODEL_FILES = (".json", ".onnx", ".pt2")


def resolve(model) -> tuple[ZooModel, str]:
    """(entry, name) of ``model``: a float model file (from_model_file), a .py model file
    (load_user_model) or a zoo name (get); ``name`` is the file's stem or the zoo name."""
    model = os.fspath(model)
    stem = os.path.splitext(os.path.basename(model))[0]
    if is_model_file(model):
        return from_model_file(model), stem
    if os.path.isfile(model) and not model.endswith(".py"):
        raise UsageError(f"{model}: not a model this can train or trace; give a zoo model ({', '.join(_ZOO)}), a .py "
                         f"file defining model(), or a float model file ({', '.join(MODEL_FILES)})")
    if model.endswith(".py") or os.path.sep in model:
        return load_user_model(model), stem
    return get(model), model


def is_model_file(path) -> bool:
    """A saved or imported model (Kiln graph .json, ONNX, PyTorch .pt2) rather than a .py model file."""
    return os.path.splitext(os.fspath(path))[1].lower() in MODEL_FILES


def from_model_file(path) -> ZooModel:
    """A float model file (a Kiln graph, e.g. from `kiln import`, an .onnx or a .pt2) as a
    GraphModule to fine-tune; its input shape (batch 1) and, for [N, classes] outputs, the
    number of classes come from the graph. It has no dataset of its own (kiln train --data)."""
    g = load_model(path)
    if len(g.inputs) != 1 or len(g.outputs) != 1:
        raise UsageError(f"{path}: kiln train fine-tunes models with one input and one output "
                         f"({len(g.inputs)} inputs, {len(g.outputs)} outputs)")
    shape = (1,) + tuple(g.types[g.inputs[0]].shape[1:])
    out = g.types[g.outputs[0]].shape
    return ZooModel(GraphModule(g), shape, "", "cross_entropy", out[-1] if len(out) == 2 else None)


def load_user_model(path) -> ZooModel:
    """Load a user model file. Convention: the file defines ``model()`` returning a Kiln Module;
    optional module-level ``INPUT_SHAPE`` (with batch 1, e.g. ``(1, 8, 8, 1)``; default: taken
    from the data), ``LOSS`` (default ``"cross_entropy"``), ``DATASET`` (``"digits"``,
    ``"synthetic"`` or an .npz path relative to the file; default ``"digits"``) and
    ``NUM_CLASSES``."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise KilnError(f"model file {path} not found")
    spec = importlib.util.spec_from_file_location(f"kiln_user_model_{abs(hash(os.path.abspath(path)))}", path)
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except Exception as e:
        raise KilnError(f"{path}: importing the model file failed: {type(e).__name__}: {e}") from e
    if not callable(getattr(mod, "model", None)):
        raise KilnError(f"{path}: a model file must define model() returning a kiln Module "
                        f"(found: {sorted(k for k in vars(mod) if not k.startswith('_'))})")
    m = mod.model()
    if not isinstance(m, M.Module):
        raise KilnError(f"{path}: model() returned {type(m).__name__}, expected a kiln.frontend.Module")
    ds = getattr(mod, "DATASET", "digits")
    if ds not in ("digits", "synthetic") and not os.path.isabs(ds):
        ds = os.path.join(os.path.dirname(os.path.abspath(path)), ds)
    shape = getattr(mod, "INPUT_SHAPE", None)
    return ZooModel(m, tuple(shape) if shape else None, ds, getattr(mod, "LOSS", "cross_entropy"),
                    getattr(mod, "NUM_CLASSES", None))
