"""PyTorch twins of Kiln's zoo models (same layers, same "same" padding, NCHW), the baseline of
benchmarks/train_bench.py: each zoo name maps to its torch.nn.Module class."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as TF

from kiln.training.zoo import MobileNetV1


class SameConv(nn.Conv2d):
    """Conv with TensorFlow/Kiln 'same' padding (extra row/column after), any stride."""

    def forward(self, x):
        pads = []
        for size, k, s in zip(x.shape[2:], self.kernel_size, self.stride):
            out = -(-size // s)
            total = max((out - 1) * s + k - size, 0)
            pads.append((total // 2, total - total // 2))
        x = TF.pad(x, (pads[1][0], pads[1][1], pads[0][0], pads[0][1]))
        return TF.conv2d(x, self.weight, self.bias, self.stride, 0, 1, self.groups)

class ConvBN(nn.Module):
    def __init__(self, cin, cout, k, stride=1, groups=1, act="relu"):
        super().__init__()
        self.conv = SameConv(cin, cout, k, stride, groups=groups)
        self.bn = nn.BatchNorm2d(cout)
        self.act = act

    def forward(self, x):
        y = self.bn(self.conv(x))
        return {"relu": torch.relu, "relu6": lambda t: torch.clamp(t, 0, 6), "none": lambda t: t}[self.act](y)

class DSCNN(nn.Module):
    def __init__(self, ch=64):
        super().__init__()
        self.stem = ConvBN(1, ch, (10, 4), 2)
        self.drop1 = nn.Dropout(0.2)
        self.blocks = nn.ModuleList([nn.Sequential(ConvBN(ch, ch, 3, groups=ch), ConvBN(ch, ch, 1)) for _ in range(4)])
        self.drop2 = nn.Dropout(0.4)
        self.fc = nn.Linear(ch, 12)

    def forward(self, x):
        x = self.drop1(self.stem(x))
        for b in self.blocks:
            x = b(x)
        return self.fc(self.drop2(x).mean((2, 3)))

class ResBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.a = ConvBN(cin, cout, 3, stride)
        self.b = ConvBN(cout, cout, 3, act="none")
        self.short = nn.Conv2d(cin, cout, 1, stride) if (stride != 1 or cin != cout) else None

    def forward(self, x):
        s = x if self.short is None else self.short(x)
        return torch.relu(self.b(self.a(x)) + s)

class ResNet8(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = ConvBN(3, 16, 3)
        self.stages = nn.ModuleList([ResBlock(16, 16, 1), ResBlock(16, 32, 2), ResBlock(32, 64, 2)])
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        x = self.stem(x)
        for s in self.stages:
            x = s(x)
        return self.fc(x.mean((2, 3)))

class MobileNet(nn.Module):
    def __init__(self, alpha=0.25):
        super().__init__()
        c = int(32 * alpha)
        self.stem = ConvBN(3, c, 3, 2, act="relu6")
        blocks = []
        for out, stride in MobileNetV1.CFG:
            o = int(out * alpha)
            blocks.append(nn.Sequential(ConvBN(c, c, 3, stride, groups=c, act="relu6"), ConvBN(c, o, 1, act="relu6")))
            c = o
        self.blocks = nn.ModuleList(blocks)
        self.fc = nn.Linear(c, 2)

    def forward(self, x):
        x = self.stem(x)
        for b in self.blocks:
            x = b(x)
        return self.fc(x.mean((2, 3)))

class DenseBN(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.fc = nn.Linear(cin, cout)
        self.bn = nn.BatchNorm1d(cout)

    def forward(self, x):
        return torch.relu(self.bn(self.fc(x)))

class AE(nn.Module):
    def __init__(self):
        super().__init__()
        sizes = [640] + [128] * 4 + [8] + [128] * 4
        self.layers = nn.ModuleList([DenseBN(a, b) for a, b in zip(sizes[:-1], sizes[1:])])
        self.out = nn.Linear(128, 640)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.out(x)

class Digits(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([SameConv(1, 8, 3), SameConv(8, 16, 3), nn.Linear(256, 10)])

    def forward(self, x):
        x = torch.relu(self.layers[0](x))
        x = TF.max_pool2d(torch.relu(self.layers[1](x)), 2)
        return self.layers[2](x.permute(0, 2, 3, 1).flatten(1))     # flatten in NHWC order, as Kiln


MODELS = {"ds-cnn": DSCNN, "resnet8": ResNet8, "mobilenet-v1-0.25": MobileNet, "fc-autoencoder": AE,
        "digits-cnn": Digits}
