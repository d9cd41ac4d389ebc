"""Static memory planner: a pure function from buffer lifetimes to arena offsets.

Input: buffers ``(name, size, first, last, align)`` where ``first``/``last`` are the indices of the
first and last command that touch the buffer (inclusive), plus optional in-place hints
``Alias(out, inp, min_shift)``: the command producing ``out`` may overwrite the dead input ``inp``
as long as ``offset[inp] - offset[out] >= min_shift`` (bytes). ``min_shift`` comes from the
kernel's access order (``backends/inplace.py``): 0 for element-wise ops (exact aliasing), a few
rows of the input for a depthwise convolution.

Output: a :class:`MemoryPlan` (offsets, peak, the strategy that won), printable and checkable
for overlap. Strategies: ``greedy_by_size`` (TensorFlow Lite Micro's GreedyMemoryPlanner) and
greedy placement in several other orders, each with and without in-place aliasing; the smallest
plan wins (ties: the earlier strategy).
"""
from __future__ import annotations

import dataclasses
import random


@dataclasses.dataclass(frozen=True)
class Buffer:
    name: str
    size: int
    first: int
    last: int
    align: int = 16

    def lives_with(self, other) -> bool:
        return self.first <= other.last and other.first <= self.last


@dataclasses.dataclass(frozen=True)
class Alias:
    """``out`` may overlap the dead input ``inp`` when offset[inp] - offset[out] >= min_shift."""
    out: str
    inp: str
    min_shift: int = 0


@dataclasses.dataclass
class MemoryPlan:
    buffers: list
    offsets: dict
    peak: int
    strategy: str = ""
    aliases: list = dataclasses.field(default_factory=list)
    tried: dict = dataclasses.field(default_factory=dict)   # strategy -> peak
    arena_align: int = 16                                    # the arena's size is a multiple of this

    @property
    def arena_bytes(self):
        return _align_up(self.peak, self.arena_align)

    def lower_bound(self):
        """Most bytes live at once without in-place aliasing (a plan cannot beat this unless it
        aliases)."""
        if not self.buffers:
            return 0
        steps = range(min(b.first for b in self.buffers), max(b.last for b in self.buffers) + 1)
        return max(sum(b.size for b in self.buffers if b.first <= t <= b.last) for t in steps)

    def check(self):
        """Raise ValueError if two simultaneously live buffers overlap (other than an allowed
        in-place pair) or an offset is misaligned."""
        bad = overlaps(self.buffers, self.offsets, self.aliases)
        if bad:
            raise ValueError("memory plan overlaps: " + "; ".join(bad))
        return self

    def table(self):
        rows = [f"memory plan ({self.strategy}): peak {self.peak} B, arena {self.arena_bytes} B"]
        rows.append(f"  {'buffer':<32} {'offset':>8} {'size':>8} {'end':>8}  life")
        for b in sorted(self.buffers, key=lambda b: (self.offsets[b.name], b.first)):
            o = self.offsets[b.name]
            rows.append(f"  {b.name:<32} {o:>8} {b.size:>8} {o + b.size:>8}  [{b.first}, {b.last}]")
        return "\n".join(rows)

    __str__ = table

    def drawing(self, width=64):
        """ASCII drawing of the arena over time: one row per command, one column per
        arena/width bytes; a letter marks each live buffer."""
        if not self.buffers or self.peak == 0:
            return "(empty arena)"
        names = sorted(self.buffers, key=lambda b: (self.offsets[b.name], b.first))
        letters = {b.name: "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"[k % 62]
                   for k, b in enumerate(names)}
        step = max(1, -(-self.peak // width))
        t0 = min(b.first for b in self.buffers)
        t1 = max(b.last for b in self.buffers)
        lines = [f"0{' ' * (width - len(str(self.peak)) - 1)}{self.peak}  (1 char = {step} B)"]
        for t in range(t0, t1 + 1):
            row = ["."] * width
            for b in self.buffers:
                if b.first <= t <= b.last and b.size:
                    o = self.offsets[b.name]
                    for c in range(o // step, min(width, -(-(o + b.size) // step))):
                        row[c] = letters[b.name]
            lines.append("".join(row) + f"  {t}")
        lines.append("  ".join(f"{letters[b.name]}={b.name}" for b in names))
        return "\n".join(lines)


def lifetimes(inputs, steps, outputs, *, born=0, end=None):
    """First and last step of every value ``({value: first}, {value: last})``, in the order values
    are born. ``inputs`` are alive at step ``born``; ``steps`` is a list of ``(reads, writes)``, one
    per step; a value lives from the step that writes it to the last step that reads it; values
    in ``outputs`` live until ``end`` (default: the last step). Shared by the C pipeline (commands)
    and the CUDA packages (steps)."""
    end = max(len(steps) - 1, 0) if end is None else end
    first, last = {}, {}
    for v in inputs:
        first[v], last[v] = born, born
    for t, (reads, writes) in enumerate(steps):
        for v in writes:
            first.setdefault(v, t)
            last[v] = max(last.get(v, t), t)
        for v in reads:
            last[v] = max(last.get(v, t), t)
    for o in outputs:
        if o in first:
            last[o] = end
    return first, last


def _align_up(x, a):
    return -(-x // a) * a


def _align_down(x, a):
    return (x // a) * a


def overlaps(buffers, offsets, aliases=()):
    allowed = {(a.out, a.inp): a.min_shift for a in aliases}
    bad = []
    for b in buffers:
        if offsets[b.name] % b.align:
            bad.append(f"{b.name} at {offsets[b.name]} is not {b.align}-byte aligned")
    for i, a in enumerate(buffers):
        for b in buffers[i + 1:]:
            if not a.lives_with(b) or a.size == 0 or b.size == 0:
                continue
            oa, ob = offsets[a.name], offsets[b.name]
            if oa < ob + b.size and ob < oa + a.size:
                if (a.name, b.name) in allowed and ob - oa >= allowed[(a.name, b.name)]:
                    continue
                if (b.name, a.name) in allowed and oa - ob >= allowed[(b.name, a.name)]:
                    continue
                bad.append(f"{a.name} [{oa}, {oa + a.size}) overlaps {b.name} [{ob}, {ob + b.size})")
    return bad


def _fits(b, off, placed, offsets, rel):
    for p in placed:
        if not b.lives_with(p) or p.size == 0:
            continue
        op = offsets[p.name]
        if off < op + p.size and op < off + b.size:
            s = rel.get((b.name, p.name))     # b is the output that may overwrite input p
            if s is not None and op - off >= s:
                continue
            s = rel.get((p.name, b.name))     # p is the output that may overwrite input b
            if s is not None and off - op >= s:
                continue
            return False
    return True


def _greedy(order, aliases):
    rel = {(a.out, a.inp): a.min_shift for a in aliases}
    offsets, placed = {}, []
    for b in order:
        if b.size == 0:
            offsets[b.name] = 0
            continue
        cands = {0}
        for p in placed:
            if not b.lives_with(p):
                continue
            op = offsets[p.name]
            cands.add(_align_up(op + p.size, b.align))
            if (b.name, p.name) in rel:
                cands.add(max(0, _align_down(op - rel[(b.name, p.name)], b.align)))
            if (p.name, b.name) in rel:
                cands.add(_align_up(op + rel[(p.name, b.name)], b.align))
        for off in sorted(cands):
            if _fits(b, off, placed, offsets, rel):
                offsets[b.name] = off
                break
        placed.append(b)
    peak = max((offsets[b.name] + b.size for b in order), default=0)
    return offsets, peak


ORDERS = {
    # TFLM GreedyMemoryPlanner: biggest first, ties by first use
    "greedy_by_size": lambda bs: sorted(bs, key=lambda b: (-b.size, b.first)),
    "greedy_by_area": lambda bs: sorted(bs, key=lambda b: (-b.size * (b.last - b.first + 1), b.first)),
    "greedy_by_lifetime": lambda bs: sorted(bs, key=lambda b: (-(b.last - b.first), -b.size)),
    "greedy_by_first_use": lambda bs: sorted(bs, key=lambda b: (b.first, -b.size)),
    # latest-born first: a chain of in-place ops whose outputs sit a little below their inputs
    # (depthwise, 1x1 conv) is laid out from its end, each input just above its output
    "greedy_reverse_time": lambda bs: sorted(bs, key=lambda b: (-b.first, -b.size)),
    "greedy_by_size_reverse_time": lambda bs: sorted(bs, key=lambda b: (-b.size, -b.first)),
}


def plan(buffers, aliases=(), strategies=None, random_orders=32, seed=0, arena_align=16) -> MemoryPlan:
    """Plan ``buffers`` (a list of :class:`Buffer`) into one arena. Tries every strategy in
    ``strategies`` (default: all of ORDERS, each without and with in-place ``aliases``) and
    ``random_orders`` seeded random orders with aliasing; returns the smallest plan (its
    ``arena_bytes``: the peak rounded up to ``arena_align``)."""
    buffers = list(buffers)
    names = [b.name for b in buffers]
    if len(set(names)) != len(names):
        raise ValueError("buffer names must be unique")
    for b in buffers:
        if b.size < 0 or b.first > b.last:
            raise ValueError(f"buffer {b.name}: bad size or lifetime ({b.size} B, [{b.first}, {b.last}])")
    known = set(names)
    aliases = [a for a in aliases if a.out in known and a.inp in known]
    for a in aliases:
        bo = next(b for b in buffers if b.name == a.out)
        bi = next(b for b in buffers if b.name == a.inp)
        if bi.last != bo.first:
            raise ValueError(f"in-place hint {a.out} <- {a.inp}: {a.inp} must die where {a.out} is born")
    best = None
    tried = {}
    cands = []
    for name, order in ORDERS.items():
        if strategies is None or name in strategies:
            cands.append((name, order(buffers), ()))
            if aliases:
                cands.append((name + "+inplace", order(buffers), aliases))
    rng = random.Random(seed)
    if aliases and strategies is None:
        for k in range(random_orders):
            bs = list(buffers)
            rng.shuffle(bs)
            cands.append((f"random{k}+inplace", bs, aliases))
    for name, order, al in cands:
        offsets, peak = _greedy(order, al)
        tried[name] = peak
        if best is None or peak < best.peak:
            best = MemoryPlan(buffers, offsets, peak, name, list(al))
    if best is None:
        best = MemoryPlan(buffers, {}, 0, "empty")
    best.tried = tried
    best.arena_align = arena_align
    return best.check()


def plot(plan_: MemoryPlan, path, title="arena"):
    """Write the memory timeline as a PNG: x = command index, y = arena offset."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle
    fig, ax = plt.subplots(figsize=(10, 5))
    cmap = plt.get_cmap("tab20")
    for k, b in enumerate(sorted(plan_.buffers, key=lambda b: b.first)):
        if b.size == 0:
            continue
        o = plan_.offsets[b.name]
        ax.add_patch(Rectangle((b.first - 0.45, o), b.last - b.first + 0.9, b.size, facecolor=cmap(k % 20),
                               edgecolor="black", linewidth=0.5, alpha=0.85))
        if b.size > plan_.peak * 0.04:
            ax.text(b.first - 0.4, o + b.size / 2, b.name[:18], fontsize=6, va="center")
    t0 = min((b.first for b in plan_.buffers), default=0)
    t1 = max((b.last for b in plan_.buffers), default=0)
    ax.set_xlim(t0 - 1, t1 + 1)
    ax.set_ylim(0, max(plan_.peak, 1) * 1.05)
    ax.axhline(plan_.peak, color="red", linestyle="--", linewidth=0.8)
    ax.set_xlabel("command")
    ax.set_ylabel("arena offset (bytes)")
    ax.set_title(f"{title}: peak {plan_.peak} B ({plan_.strategy})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
