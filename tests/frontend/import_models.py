"""PyTorch models the importer tests use: the five the import must carry (a CNN, a depthwise-separable
net, a Conv1d net with BatchNorm1d, a residual net, an LSTM), more blocks, and small versions of
torchvision's mobilenet_v2 and resnet18 architectures (written out: torchvision is not installed
beside torch 2.13 here). Imported only where torch is (``pytest.importorskip``)."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as Fn


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.c2, self.fc = nn.Conv2d(8, 16, 3, stride=2), nn.Linear(16 * 2 * 2, 10)

    def forward(self, x):
        x = Fn.max_pool2d(torch.relu(self.bn(self.c1(x))), 2)
        return self.fc(torch.flatten(torch.relu(self.c2(x)), 1))


class DSNet(nn.Module):
    """Depthwise-separable blocks (MobileNet v1 style)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.dw, self.b1 = nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.BatchNorm2d(8)
        self.pw, self.b2 = nn.Conv2d(8, 16, 1), nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 5)

    def forward(self, x):
        x = Fn.relu6(self.stem(x))
        x = Fn.relu6(self.b2(self.pw(Fn.relu6(self.b1(self.dw(x))))))
        return self.fc(Fn.adaptive_avg_pool2d(x, 1).flatten(1))


class Conv1dNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c, self.bn = nn.Conv1d(4, 8, 5, padding=2), nn.BatchNorm1d(8)
        self.c2 = nn.Conv1d(8, 8, 3, padding=1, groups=8)
        self.fc = nn.Linear(8 * 8, 3)

    def forward(self, x):
        x = Fn.max_pool1d(Fn.relu(self.bn(self.c(x))), 2)
        return self.fc(torch.flatten(Fn.relu(self.c2(x)), 1))


class ResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.a, self.ba = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.c, self.bc = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        y = self.bc(self.c(torch.relu(self.ba(self.a(x)))))
        return self.fc(torch.relu(x + y).mean((2, 3)))


class LSTMNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm, self.fc = nn.LSTM(6, 12, batch_first=True), nn.Linear(12, 3)

    def forward(self, x):
        y, _ = self.lstm(x)
        return self.fc(y[:, -1])


class StackedLSTM(nn.Module):
    """Two layers, sequence-first input, the final hidden state."""

    def __init__(self):
        super().__init__()
        self.lstm, self.fc = nn.LSTM(6, 8, num_layers=2), nn.Linear(8, 3)

    def forward(self, x):
        _, (h, _) = self.lstm(x)
        return self.fc(h[-1])


class BiGRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru, self.fc = nn.GRU(6, 8, batch_first=True, bidirectional=True), nn.Linear(16, 3)

    def forward(self, x):
        y, _ = self.gru(x)
        return self.fc(y[:, -1])


class Blocks(nn.Module):
    """Activations, padding modes, upsampling, pooling variants, concat, permute."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 8, 3, padding="same")
        self.d = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8, padding_mode="reflect")
        self.e = nn.Conv2d(8, 8, 3, padding=2, dilation=2, padding_mode="replicate")

    def forward(self, x):
        y = Fn.hardswish(self.c(x))
        y = Fn.silu(self.d(y))
        y = Fn.gelu(y) + Fn.leaky_relu(y, 0.1) + Fn.hardsigmoid(y) + Fn.gelu(y, approximate="tanh")
        y = torch.sigmoid(self.e(y)) * torch.tanh(y)
        y = Fn.interpolate(y, scale_factor=2, mode="nearest")
        z = Fn.avg_pool2d(y, 3, 2, 1) + Fn.max_pool2d(y, 3, 2, 1, ceil_mode=False)
        w = Fn.avg_pool2d(y, 3, 2, ceil_mode=True, count_include_pad=False)
        g = Fn.adaptive_avg_pool2d(y, 1)
        return (torch.softmax(g.view(g.size(0), -1), dim=1), z, torch.cat([z, z * 2], 1).permute(0, 2, 3, 1),
                w.mean((2, 3), keepdim=True))


class InvertedResidual(nn.Module):
    """torchvision.models.mobilenetv2.InvertedResidual."""

    def __init__(self, inp, oup, stride, expand):
        super().__init__()
        hidden = inp * expand
        self.use_res = stride == 1 and inp == oup
        layers = []
        if expand != 1:
            layers += [nn.Conv2d(inp, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(inplace=True)]
        layers += [nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False), nn.BatchNorm2d(hidden),
                   nn.ReLU6(inplace=True), nn.Conv2d(hidden, oup, 1, bias=False), nn.BatchNorm2d(oup)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2(nn.Module):
    """torchvision's mobilenet_v2 architecture (its inverted-residual settings) at width 0.25."""
    SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1)]

    def __init__(self, classes=10, width=0.25):
        super().__init__()
        ch = lambda c: max(8, int(c * width + 4) // 8 * 8)
        inp = ch(32)
        feats = [nn.Sequential(nn.Conv2d(3, inp, 3, 2, 1, bias=False), nn.BatchNorm2d(inp), nn.ReLU6(inplace=True))]
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                feats.append(InvertedResidual(inp, ch(c), s if i == 0 else 1, t))
                inp = ch(c)
        last = 1280
        feats.append(nn.Sequential(nn.Conv2d(inp, last, 1, bias=False), nn.BatchNorm2d(last), nn.ReLU6(inplace=True)))
        self.features = nn.Sequential(*feats)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last, classes))

    def forward(self, x):
        x = Fn.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


class BasicBlock(nn.Module):
    """torchvision.models.resnet.BasicBlock."""

    def __init__(self, inp, out, stride):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(inp, out, 3, stride, 1, bias=False), nn.BatchNorm2d(out)
        self.conv2, self.bn2 = nn.Conv2d(out, out, 3, 1, 1, bias=False), nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = (nn.Sequential(nn.Conv2d(inp, out, 1, stride, bias=False), nn.BatchNorm2d(out))
                           if stride != 1 or inp != out else None)

    def forward(self, x):
        idt = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(y)) + idt)


class ResNet18(nn.Module):
    """torchvision's resnet18 architecture ([2, 2, 2, 2] BasicBlocks, 7x7 stem, max pool) at width
    ``base`` (torchvision: 64)."""

    def __init__(self, classes=10, base=16):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, base, 7, 2, 3, bias=False), nn.BatchNorm2d(base)
        self.relu, self.maxpool = nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)
        layers, inp = [], base
        for i, w in enumerate([base, base * 2, base * 4, base * 8]):
            layers.append(nn.Sequential(BasicBlock(inp, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)))
            inp = w
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool, self.fc = nn.AdaptiveAvgPool2d((1, 1)), nn.Linear(inp, classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# name -> (class, example input shape); the first five are the ones the import must carry
MODELS = {
    "cnn": (CNN, (2, 3, 12, 12)),
    "dsnet": (DSNet, (2, 3, 16, 16)),
    "conv1d": (Conv1dNet, (2, 4, 16)),
    "resnet": (ResNet, (2, 3, 8, 8)),
    "lstm": (LSTMNet, (2, 5, 6)),
    "stacked_lstm": (StackedLSTM, (5, 2, 6)),
    "bigru": (BiGRU, (2, 4, 6)),
    "blocks": (Blocks, (1, 3, 8, 8)),
    "mobilenet_v2": (MobileNetV2, (1, 3, 64, 64)),
    "resnet18": (ResNet18, (1, 3, 64, 64)),
}
REQUIRED = ["cnn", "dsnet", "conv1d", "resnet", "lstm"]


def make(name, seed=0):
    """The model ``name`` in eval mode, seeded, with non-trivial BatchNorm statistics."""
    cls, shape = MODELS[name]
    torch.manual_seed(seed)
    m = cls()
    for mod in m.modules():
        if isinstance(mod, (nn.BatchNorm1d, nn.BatchNorm2d)):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
            mod.weight.data.uniform_(0.5, 1.5)
            mod.bias.data.uniform_(-0.5, 0.5)
    return m.eval(), shape


def inputs(shape, n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g) for _ in range(n)]
