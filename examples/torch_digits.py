"""Bring a PyTorch model: train a small CNN in PyTorch on the 8x8 digits Kiln ships, save it with
torch.export, then import it into Kiln, quantise it to int8 and run it on an emulated Cortex-M4
(mps2-an386), reporting accuracy for the float model, the int8 model and the board.

    python examples/torch_digits.py                       # all of it (about a minute)
    python examples/torch_digits.py --train-only          # only the PyTorch part; then the kiln
                                                          # commands this prints, one by one

Writes into --out (default runs/torch-digits): digits_cnn.pt2 (torch.export.save), digits.npz
(x_train, y_train, x_test, y_test; images NCHW [N, 1, 8, 8] as the PyTorch model takes them),
digits_cnn.json (the imported float graph) and digits_cnn_int8.json. Needs torch
(pip install 'kiln-ml[torch]') and, for the board, arm-none-eabi-gcc and QEMU
(bash scripts/setup.sh installs them).
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys

import numpy as np
import torch
from torch import nn

from kiln.cli import main as kiln_main
from kiln.data import digits


class DigitsCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


def digits_nchw():
    """Kiln's digits split (NHWC) as NCHW arrays for PyTorch."""
    train, test = digits()
    nchw = lambda ds: np.ascontiguousarray(ds.x.transpose(0, 3, 1, 2))
    return nchw(train), train.y, nchw(test), test.y


def train(epochs, seed):
    torch.manual_seed(seed)
    xtr, ytr, xte, yte = digits_nchw()
    model = DigitsCNN()
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    x, y = torch.from_numpy(xtr), torch.from_numpy(ytr)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        model.train()
        for idx in torch.randperm(len(x), generator=gen).split(64):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        acc = float((model(torch.from_numpy(xte)).argmax(1).numpy() == yte).mean())
    return model, acc, (xtr, ytr, xte, yte)


def kiln_commands(out):
    pt2, data = os.path.join(out, "digits_cnn.pt2"), os.path.join(out, "digits.npz")
    fjson, qjson = os.path.join(out, "digits_cnn.json"), os.path.join(out, "digits_cnn_int8.json")
    return [["import", pt2, "-o", fjson, "--check", "8"],
            ["quantize", fjson, "--data", data, "--out", qjson],
            ["run", qjson, "--board", "mps2-an386", "--data", data]]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/torch-digits", help="output folder (default: runs/torch-digits)")
    p.add_argument("--epochs", type=int, default=15, help="PyTorch training epochs (default: 15)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-only", action="store_true", help="stop after the PyTorch part; print the kiln commands")
    p.add_argument("--limit", type=int, default=None, help="run only this many test images on the board")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    model, acc, (xtr, ytr, xte, yte) = train(args.epochs, args.seed)
    print(f"PyTorch: trained {args.epochs} epochs, test accuracy {acc:.2%} ({len(yte)} images)")
    torch.export.save(torch.export.export(model, (torch.from_numpy(xte[:1]),)), os.path.join(args.out, "digits_cnn.pt2"))
    np.savez(os.path.join(args.out, "digits.npz"), x_train=xtr, y_train=ytr, x_test=xte, y_test=yte)
    commands = kiln_commands(args.out)
    if args.limit:
        commands[-1] += ["--limit", str(args.limit)]
    if args.train_only:
        print("\n".join("kiln " + shlex.join(c) for c in commands))
        return 0
    for c in commands:
        print(f"\n$ kiln {shlex.join(c)}", flush=True)
        rc = kiln_main(c)
        if rc != 0:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
