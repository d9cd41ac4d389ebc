"""Markdown + PNG renderings of command reports."""
from __future__ import annotations

import json
import os
import shutil


def _plot_layers(per_layer, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [l["name"] for l in per_layer]
    ins = [l["instructions"] or 0 for l in per_layer]
    macs = [l["macs"] or 0 for l in per_layer]
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(names) + 2), 3.6))
    ax.bar(range(len(names)), ins, color="#c0504d")
    for i, (n, m) in enumerate(zip(ins, macs)):
        if n and m:
            ax.text(i, n, f"{m / n:.2f}\nMAC/ins", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.set_ylim(0, max(ins + [1]) * 1.25)   # room for the MAC/instruction labels
    ax.set_ylabel("instructions")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_roofline(per_layer, path, title):
    """Two panels per command: executed instructions, and MACs per instruction against the core's
    ceiling (``limit_macs_per_instruction`` of ``kiln run``'s per-layer rows)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [l["name"] for l in per_layer]
    ins = [l["instructions"] or 0 for l in per_layer]
    rate = [l.get("macs_per_instruction") or 0 for l in per_layer]
    limit = max([l.get("limit_macs_per_instruction") or 0 for l in per_layer] + [0])
    x = range(len(names))
    fig, (a1, a2) = plt.subplots(2, 1, sharex=True, figsize=(max(6, 0.6 * len(names) + 2), 5.6))
    a1.bar(x, ins, color="#c0504d")
    a1.set_ylabel("instructions")
    a1.set_title(title)
    a2.bar(x, rate, color="#4f81bd", label="MACs / instruction")
    if limit:
        a2.axhline(limit, color="k", linestyle="--", linewidth=1, label=f"ceiling of the core ({limit})")
        a2.set_ylim(0, limit * 1.1)
    a2.set_ylabel("MACs / instruction")
    a2.legend(fontsize=8, loc="upper right")
    a2.set_xticks(list(x))
    a2.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def stage_times(times: dict, short=True) -> str:
    """Stage times as text, in order: "train 6.1 s, quantise 0.4 s" (``short``: each stage's first
    word), else one "- stage: 6.1 s" line per stage (Markdown)."""
    if short:
        return ", ".join(f"{name.split()[0]} {sec:.1f} s" for name, sec in times.items())
    return "\n".join(f"- {name}: {sec:.1f} s" for name, sec in times.items())


def write_demo_report(rep, out, memory_png=None):
    """Write report.md, report.json, latency.png (and memory.png) into ``out``; returns the .md path."""
    lat, mem = rep["latency"], rep["memory"]
    _plot_layers(lat["per_layer"], os.path.join(out, "latency.png"),
                 f"per-layer instructions on {rep['board']} (total {lat['instructions_per_inference'] or 0:,})")
    has_mem = memory_png and os.path.exists(memory_png)
    if has_mem:
        shutil.copy(memory_png, os.path.join(out, "memory.png"))
    pct = lambda v: f"{100 * v:.2f}%"
    md = [f"# Kiln demo report: digits CNN on {rep['board']}", "",
          "| | value |", "|---|---|",
          f"| float accuracy (host) | {pct(rep['float_accuracy'])} |",
          f"| int8 accuracy, reference (host) | {pct(rep['int8_reference_accuracy'])} |",
          f"| int8 accuracy, generated C (host) | {pct(rep['int8_host_c_accuracy'])} (bit-exact: {rep['host_c_bit_exact']}) |",
          f"| int8 accuracy, {rep['board']} ({rep['board_images']} images) | {pct(rep['int8_board_accuracy'])} (bit-exact: {rep['board_bit_exact']}) |",
          f"| instructions / inference | {lat['instructions_per_inference']:,} ({lat['instruction_source']}) |" if lat["instructions_per_inference"] else "| instructions / inference | n/a |",
          f"| MACs / instruction | {lat['macs_per_instruction']} |",
          f"| arena | {mem['arena_bytes']:,} B |",
          f"| stack high-water | {mem['stack_used_bytes']:,} B |",
          f"| flash | {mem['flash_bytes']:,} B |",
          f"| RAM | {mem['ram_bytes']:,} B |",
          "", "## Per-layer latency", "", "![latency](latency.png)", "",
          "| command | ops | MACs | instructions | MAC/instr |", "|---|---|---|---|---|"]
    for l in lat["per_layer"]:
        ins = l["instructions"]
        md.append(f"| {l['name']} | {l.get('ops') or ''} | {l['macs']:,} | {ins if ins is not None else 'n/a'} | "
                  f"{(l['macs'] / ins) if ins else 0:.3f} |")
    if has_mem:
        md += ["", "## Memory plan", "", "![memory plan](memory.png)"]
    md += ["", "## Stage times", "", stage_times(rep["stage_seconds"], short=False)]
    path = os.path.join(out, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(md) + "\n")
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump({k: v for k, v in rep.items() if k != "text"}, f, indent=1, default=str)
    return path
