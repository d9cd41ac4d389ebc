"""kiln demo: the main job, end to end.

Train the digits CNN on the host, quantise it to int8 (PTQ), compile it for a Cortex-M4 with TVM,
build firmware for the emulated mps2-an386 board, run the whole test set on it under QEMU, check
every board output bit for bit against the host int8 reference, and report accuracy, latency and
memory (table, JSON, Markdown report with PNG plots).
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

from kiln import hil
from kiln.docs_util import write_section
from kiln.frontend import save
from kiln.quantize import ptq
from kiln.report import stage_times, write_demo_report
from kiln.training import train_digits
from kiln.training.data import digits


def add_arguments(p):
    p.add_argument("--board", default="mps2-an386", help="emulated board to run on (default mps2-an386)")
    p.add_argument("--out", default="runs/demo", help="output folder for the model, package, firmware and report")
    p.add_argument("--seed", type=int, default=0, help="seed of the digits CNN training run (default: 0)")
    p.add_argument("--limit", type=int, default=None, help="run only the first N test images on the board")
    p.add_argument("--port", default=None, help="run on a real board at this serial port instead of QEMU")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--markdown", default=None,
                   help="also write the summary as the '## Demo (kiln demo)' section of this Markdown file "
                        "(e.g. docs/benchmarks.md)")


class _Stage:
    def __init__(self, quiet):
        self.quiet = quiet
        self.t0 = time.time()
        self.times = {}

    def __call__(self, name):
        self.name = name
        self.start = time.time()
        if not self.quiet:
            print(f"[kiln demo] {name} ...", file=sys.stderr, flush=True)
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.times[self.name] = round(time.time() - self.start, 2)


def _bar(total, desc, quiet):
    if quiet or not sys.stderr.isatty():       # no progress bars in logs and pipes
        return None
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, file=sys.stderr, unit="img", leave=True, mininterval=0.2)


def _argmax(ys):
    return np.array([int(np.argmax(np.asarray(y).reshape(-1))) for y in ys])


def run(args):
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    stage = _Stage(args.quiet or args.json)
    rep = {"board": args.board, "out": out, "seed": args.seed}

    with stage("train the digits CNN on the host"):
        r = train_digits(seed=args.seed, out=os.path.join(out, "train"), quiet=args.quiet or args.json,
                         force=True)     # the demo's own folder: each demo replaces the last one's run
        save(r.graph, os.path.join(out, "digits_cnn_float.json"))
    train, test = digits()
    labels = np.asarray(test.y)
    rep["float_accuracy"] = float(r.metrics["test_acc"])
    rep["train_steps"] = int(r.metrics.get("steps", 0))

    with stage("quantise to int8 (PTQ, per-channel, min/max calibration)"):
        q = ptq(r.graph, train.x[:512], per_channel=True, method="minmax", int8_io=True)
        save(q, os.path.join(out, "digits_cnn_int8.json"))
        qin = q.types[q.inputs[0]].quant
        scale, zp = qin.scale[0], qin.zero_point[0]
        xq = np.clip(np.round(test.x / scale) + zp, -128, 127).astype(np.int8)
        ref = hil.reference_outputs(q, xq)
    rep["int8_reference_accuracy"] = float(np.mean(_argmax(ref) == labels))

    with stage("compile for Cortex-M4 with TVM (C kernels, memory plan, command buffer)"):
        pkg = hil.compile_model(q, "cortex-m4", os.path.join(out, "package"))
        host = pkg.run  # ctypes, host gcc
        hy = [host(x[None])[0] for x in xq]
    host_exact = all(np.array_equal(np.asarray(a).reshape(-1), np.asarray(b).reshape(-1)) for a, b in zip(hy, ref))
    rep["int8_host_c_accuracy"] = float(np.mean(_argmax(hy) == labels))
    rep["host_c_bit_exact"] = bool(host_exact)

    n = len(xq) if args.limit is None else min(args.limit, len(xq))
    with stage(f"build firmware for {args.board} and run {n} test images on it"):
        image, pkg_dir = hil.build_for_board(pkg.path, args.board, out)
        bar = _bar(n, f"{args.board} inferences", args.quiet or args.json)
        br = hil.run_on_board(image, pkg_dir, list(xq[:n]), port=args.port,
                              progress=(lambda k, t: bar.update(1)) if bar else None)
        if bar:
            bar.close()
    mism = [k for k in range(n) if not np.array_equal(br.outputs[k].reshape(-1), np.asarray(ref[k]).reshape(-1))]
    rep["int8_board_accuracy"] = float(np.mean(_argmax(br.outputs) == labels[:n]))
    rep["board_images"] = n
    rep["board_bit_exact"] = not mism
    rep["board_mismatches"] = mism[:20]
    macs = int(pkg.manifest.macs)
    insn = [i for i in br.instructions if i is not None]
    rep["latency"] = {
        "instructions_per_inference": int(insn[0]) if insn else None,
        "instructions_identical_across_inputs": len(set(insn)) == 1 if insn else None,
        "instruction_source": br.instruction_source,
        "macs": macs,
        "macs_per_instruction": round(macs / insn[0], 4) if insn else None,
        "per_layer": br.profile,
    }
    rep["memory"] = {"arena_bytes": pkg.manifest.arena_bytes, "stack_used_bytes": br.stack_used,
                     "stack_size_bytes": br.stack_size, "weight_bytes": pkg.manifest.weight_bytes,
                     "flash_bytes": br.sizes.get("flash_used"), "ram_bytes": br.sizes.get("ram_used"),
                     "text": br.sizes.get("text"), "rodata": br.sizes.get("rodata"), "data": br.sizes.get("data"),
                     "bss": br.sizes.get("bss")}
    rep["stage_seconds"] = stage.times
    rep["total_seconds"] = round(time.time() - stage.t0, 1)
    rep["ok"] = bool(host_exact and not mism)
    rep["report"] = write_demo_report(rep, out, os.path.join(pkg.path, "memory.png"))
    rep["text"] = _table(rep)
    if args.markdown:
        write_section(args.markdown, _markdown_section(rep))
    return rep


def _markdown_section(rep):
    lat, mem = rep["latency"], rep["memory"]
    pct = lambda v: f"{100 * v:.2f}%"
    return "\n".join([
        "## Demo (kiln demo)", "",
        f"Produced by `kiln demo --markdown docs/benchmarks.md` (seed {rep.get('seed', 0)}): the digits CNN trained on "
        "the host, PTQ int8, compiled for Cortex-M4, all 360 test images run on the emulated "
        f"{rep['board']} under QEMU.", "",
        "| | value |", "|---|---|",
        f"| float accuracy | {pct(rep['float_accuracy'])} |",
        f"| int8 accuracy: reference / generated C on host / {rep['board']} | {pct(rep['int8_reference_accuracy'])} / "
        f"{pct(rep['int8_host_c_accuracy'])} / {pct(rep['int8_board_accuracy'])} |",
        f"| board outputs bit-exact with the int8 reference | {'all ' + str(rep['board_images']) if rep['board_bit_exact'] else 'NO'} |",
        f"| instructions / inference ({lat['instruction_source']}) | {lat['instructions_per_inference']:,} |",
        f"| MACs / instruction | {lat['macs_per_instruction']} ({lat['macs']:,} MACs) |",
        f"| arena / stack high-water | {mem['arena_bytes']:,} B / {mem['stack_used_bytes']:,} B |",
        f"| flash / RAM (whole image) | {mem['flash_bytes']:,} B / {mem['ram_bytes']:,} B |",
        f"| wall time (all stages) | {rep['total_seconds']} s |", ""])


def _table(rep):
    lat, mem = rep["latency"], rep["memory"]
    pct = lambda v: f"{100 * v:.2f}%"
    rows = [
        ("accuracy, float (host)", pct(rep["float_accuracy"])),
        ("accuracy, int8 reference (host)", pct(rep["int8_reference_accuracy"])),
        ("accuracy, int8 generated C (host)", pct(rep["int8_host_c_accuracy"]) + ("  bit-exact" if rep["host_c_bit_exact"] else "  MISMATCH")),
        (f"accuracy, int8 on {rep['board']} ({rep['board_images']} images)",
         pct(rep["int8_board_accuracy"]) + ("  bit-exact" if rep["board_bit_exact"] else f"  MISMATCH on {rep['board_mismatches']}")),
        ("instructions / inference", f"{lat['instructions_per_inference']:,} ({lat['instruction_source']})" if lat["instructions_per_inference"] else "n/a"),
        ("MACs / instruction", f"{lat['macs_per_instruction']} ({lat['macs']:,} MACs)"),
        ("arena", f"{mem['arena_bytes']:,} B"),
        ("stack high-water", f"{mem['stack_used_bytes']:,} B of {mem['stack_size_bytes']:,} B"),
        ("flash (code + weights)", f"{mem['flash_bytes']:,} B (.text {mem['text']:,}, .rodata {mem['rodata']:,})"),
        ("RAM", f"{mem['ram_bytes']:,} B"),
        ("time", f"{rep['total_seconds']} s ({stage_times(rep['stage_seconds'])})"),
        ("report", rep["report"]),
    ]
    w = max(len(k) for k, _ in rows)
    lines = ["Kiln demo: digits CNN, host -> int8 -> Cortex-M4 -> " + rep["board"], ""]
    lines += [f"  {k:<{w}}  {v}" for k, v in rows]
    lines.append("\nper layer on the board:")
    for l in lat["per_layer"]:
        ins = l["instructions"]
        lines.append(f"  {l['name']:<22} {l.get('ops') or '':<28} {l['macs']:>8,} MACs  "
                     + (f"{ins:>10,} instr  {l['macs'] / ins if ins else 0:.3f} MAC/instr" if ins else ""))
    lines.append("\nOK: every output bit-exact" if rep["ok"] else "\nFAILED: outputs differ")
    return "\n".join(lines)
