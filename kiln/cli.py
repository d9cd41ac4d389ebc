"""The ``kiln`` command line. Each sub-command lives in ``kiln/commands/<name>.py`` and defines
``add_arguments(parser)`` and ``run(args) -> dict`` (the report). The CLI prints the report as a
table, or as one JSON object with ``--json``, and exits non-zero when the report says ``ok: false``
or a KilnError is raised: exit code 1 for a failed check, 2 for a usage or infrastructure error
(a ``kiln.frontend.errors.UsageError``: bad arguments, an unwritable output folder, a full disk;
argparse's own errors exit 2 too)."""
from __future__ import annotations

import argparse
import importlib
import json
import sys

from . import __version__

COMMANDS = {
    "demo": "train, quantise, compile and run the digits CNN on an emulated board; write a report",
    "train": "train a model-zoo model or a user model on the host",
    "quantize": "post-training quantisation or QAT to int8, with a float-vs-int8 accuracy report",
    "inspect": "show a model's ops, tensors, quantisation, MACs and memory",
    "compile": "compile a model to a C package (Cortex-M / host) or a CUDA package",
    "build": "build firmware for a board from a model or a compiled package",
    "run": "run a model on a board (QEMU or real) and report latency and memory",
    "verify": "check golden input/output pairs on a target (reference, host, a board, cuda)",
    "golden": "write golden input/output pairs from LiteRT's reference kernels or Kiln's reference",
    "bench": "benchmark the shared models across targets and write docs/benchmarks.md",
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


def _load(name):
    try:
        return importlib.import_module(f"kiln.commands.{name}")
    except ModuleNotFoundError as e:
        if e.name == f"kiln.commands.{name}":
            return None
        raise


def _print_report(report):
    text = report.get("text") if isinstance(report, dict) else None
    if text:
        print(text)
        return
    for k, v in (report or {}).items():
        print(f"{k}: {v}")


def user_errors():
    """Exception types that mean 'bad input or a failed check', reported without a traceback.
    boards/ and firmware/ import nothing of the compiler, so their errors are listed here."""
    from kiln.frontend.errors import KilnError
    errs = [KilnError]
    for mod, name in (("kiln.boards.schema", "BoardError"), ("kiln.boards.device", "DeviceError"),
                      ("kiln.boards.qemu", "QemuError"), ("kiln.firmware.build", "FirmwareError")):
        try:
            errs.append(getattr(importlib.import_module(mod), name))
        except (ImportError, AttributeError):
            pass
    return tuple(errs)


def exit_code(error):
    """2 for a usage or infrastructure error (UsageError: bad arguments, an unwritable output, a
    full disk), 1 for every other error Kiln reports (a failed check)."""
    from kiln.frontend.errors import UsageError
    return 2 if isinstance(error, UsageError) else 1


def main(argv=None):
    KilnError = user_errors()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 0
    mod = _load(args.command)
    if mod is None:
        msg = f"'kiln {args.command}' is not available in this build yet"
        print(json.dumps({"ok": False, "error": msg}) if args.json else f"error: {msg}", file=sys.stdout if args.json else sys.stderr)
        return 2
    try:
        report = mod.run(args)
    except KilnError as e:
        if args.json:
            print(json.dumps({"ok": False, "command": args.command, "error": str(e), "error_type": type(e).__name__}))
        else:
            print(f"error: {e}", file=sys.stderr)
        return exit_code(e)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    report = report or {}
    report.setdefault("ok", True)
    report.setdefault("command", args.command)
    if args.json:
        print(json.dumps({k: v for k, v in report.items() if k != "text"}, default=_json_default))
    else:
        _print_report(report)
    return 0 if report.get("ok", True) else 1


def _json_default(o):
    import numpy as np
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


if __name__ == "__main__":
    sys.exit(main())
