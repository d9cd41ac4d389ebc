"""The ``kiln`` command line. Each sub-command lives in ``kiln/commands/<name>.py`` and defines
``add_arguments(parser)`` and ``run(args) -> dict`` (the report). The CLI prints the report as a
table, or as one JSON object with ``--json``, and exits non-zero when the report says ``ok: false``
or an error is raised: 1 when a check failed, 2 for a usage or infrastructure error."""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

import numpy as np

from kiln.common.errors import CheckFailed, KilnError
from kiln.common.version import __version__

COMMANDS = {
    "demo": "train, quantise, compile and run the digits CNN on an emulated board; write a report",
    "train": "train a model-zoo model or a user model on the host",
    "import": "import a PyTorch (.pt2) or ONNX (.onnx) model into a Kiln graph, checked against its framework",
    "export": "export a float model to ONNX (.onnx), checked with onnxruntime",
    "quantize": "post-training quantisation or QAT to int8, with a float-vs-int8 accuracy report",
    "inspect": "show a model's ops, tensors, quantisation, MACs and memory",
    "compile": "compile a model to a C package (Cortex-M / host) or a CUDA package",
    "build": "build firmware for a board from a model or a compiled package",
    "run": "run a model on a board (QEMU or real) and report latency and memory",
    "verify": "check golden input/output pairs on a target (reference, host, a board, cuda), or a float model on "
              "cuda-sim against float64 (--float64)",
    "golden": "write golden input/output pairs from LiteRT's reference kernels or Kiln's reference",
    "bench": "benchmark models across the emulated boards (--write: into docs/benchmarks.md)",
    "boards": "list the boards Kiln knows",
}


def build_parser():
    p = argparse.ArgumentParser(prog="kiln", description="Kiln: neural networks from a workstation to "
                                "microcontrollers and GPU servers, verified on the target.")
    p.add_argument("--version", action="version", version=f"kiln {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_ in COMMANDS.items():
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.add_argument("--json", action="store_true", help="print one JSON object with the results")
        mod = _load(name)
        if mod is not None:
            mod.add_arguments(sp)
    return p


MODULES = {"import": "import_"}     # commands whose name is a Python keyword


def _load(name):
    module = f"kiln.commands.{MODULES.get(name, name)}"
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name == module:
            return None
        raise


def _print_report(report):
    text = report.get("text") if isinstance(report, dict) else None
    if text:
        _emit(text, sys.stdout)
        return
    _emit("\n".join(f"{k}: {v}" for k, v in (report or {}).items()), sys.stdout)


def _emit(text, stream):
    """Print, ending quietly when the reader went away (`kiln ... | head`): no BrokenPipeError."""
    try:
        print(text, file=stream, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        raise SystemExit(0) from None


def _fail(args, error, code):
    if args.json:
        _emit(json.dumps({"ok": False, "command": args.command, "error": str(error),
                          "error_type": type(error).__name__, "exit_code": code}), sys.stdout)
    else:
        _emit(f"error: {error}", sys.stderr)
    return code


def main(argv=None):
    """Exit codes: 0 ok; 1 a check failed (a report with ok: false, or CheckFailed); 2 a usage or
    infrastructure error (bad arguments, a malformed model, a missing tool, a silent board)."""
    parser = build_parser()
    args = parser.parse_args(argv)   # argparse exits 2 on bad arguments
    if not args.command:
        parser.print_usage(sys.stderr)
        print("kiln: error: a command is required (kiln --help lists them)", file=sys.stderr)
        return 2
    mod = _load(args.command)
    if mod is None:
        return _fail(args, KilnError(f"'kiln {args.command}' is not available in this build yet"), 2)
    try:
        report = mod.run(args)
    except CheckFailed as e:
        return _fail(args, e, 1)
    except KilnError as e:
        return _fail(args, e, 2)
    except KeyboardInterrupt:
        _emit("interrupted", sys.stderr)
        return 130
    report = report or {}
    report.setdefault("ok", True)
    report.setdefault("command", args.command)
    if args.json:
        _emit(json.dumps({k: v for k, v in report.items() if k != "text"}, default=_json_default), sys.stdout)
    else:
        _print_report(report)
    return 0 if report.get("ok", True) else 1


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


if __name__ == "__main__":
    sys.exit(main())
