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

import bisect
import dataclasses
import itertools
import random

import numpy as np


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
    """Messages for every misaligned offset and every pair of buffers live at the same time whose
    bytes overlap (other than as an in-place hint allows). Pairs are found by a sweep over the
    buffers in order of first use, so the cost grows with the pairs that live together."""
    allowed = {(a.out, a.inp): a.min_shift for a in aliases}
    bad = []
    for b in buffers:
        if offsets[b.name] % b.align:
            bad.append(f"{b.name} at {offsets[b.name]} is not {b.align}-byte aligned")
    index = {id(b): k for k, b in enumerate(buffers)}
    live = []
    for b in sorted((b for b in buffers if b.size), key=lambda b: b.first):
        live = [a for a in live if a.last >= b.first]
        for a in sorted(live, key=lambda a: index[id(a)]):
            if index[id(a)] > index[id(b)]:
                a, b2 = b, a
            else:
                b2 = b
            oa, ob = offsets[a.name], offsets[b2.name]
            if oa < ob + b2.size and ob < oa + a.size:
                if (a.name, b2.name) in allowed and ob - oa >= allowed[(a.name, b2.name)]:
                    continue
                if (b2.name, a.name) in allowed and oa - ob >= allowed[(b2.name, a.name)]:
                    continue
                bad.append(f"{a.name} [{oa}, {oa + a.size}) overlaps {b2.name} [{ob}, {ob + b2.size})")
        live.append(b)
    return bad


def _neighbours(buffers):
    """For each buffer (by index), the indices of the other nonempty buffers whose lifetimes meet
    its own, ascending (int32): what a placement must avoid, whatever the order; None for a buffer
    that meets more than a quarter of them (one that lives to the end: ``_place`` scans them all,
    which costs the same and keeps this list's memory down). Computed once per plan (every
    strategy's placement reads it) from the buffers sorted by first use."""
    first = np.array([b.first for b in buffers], np.int64)
    last = np.array([b.last for b in buffers], np.int64)
    nonempty = np.array([b.size > 0 for b in buffers], bool)
    by_first = np.argsort(first, kind="stable").astype(np.int32)
    sorted_first = first[by_first]
    out = []
    for k, b in enumerate(buffers):
        if not nonempty[k]:
            out.append(np.zeros(0, np.int32))
            continue
        cand = by_first[:np.searchsorted(sorted_first, b.last, "right")]   # born by b's end
        cand = cand[(last[cand] >= b.first) & nonempty[cand] & (cand != k)]
        out.append(np.sort(cand) if len(cand) <= len(buffers) // 4 else None)
    return out


SMALL = 24          # fewer live intervals than this: plain Python beats NumPy's per-call cost


def _lowest_fit(lo, le, size, align, extra, exempt):
    """The lowest candidate offset (0, the end of a live placed interval [lo, le) rounded up to
    ``align``, or one of ``extra``, the in-place hints') where ``size`` bytes overlap no interval
    other than as ``exempt`` allows: {interval index: [(lowest, highest) ok offset, either None]}.

    An offset c clashes with an interval iff lo < c + size and le > c. An exempt interval clashes
    only where no hint allows c (c < lowest, c > highest): the interval [lo, min(le, lowest)) or
    [max(lo, highest + size), le) clashes exactly there, so it joins the others as that. Sorted
    by lo, the intervals with lo < c + size are a prefix (a binary search), and c clashes with
    one of them iff the prefix's largest le exceeds c: one sort of the live intervals, not every
    candidate against every interval (long unrolled models have hundreds of each)."""
    if len(lo) < SMALL:
        return _lowest_fit_small(lo.tolist(), le.tolist(), size, align, extra, exempt)
    cand = -(-le // align) * align
    if exempt:
        cand = np.concatenate(([0], cand, extra))
        lo, le = lo.copy(), le.copy()
        for i, oks in exempt.items():
            lo[i], le[i] = _exempt_interval(int(lo[i]), int(le[i]), size, oks)
    elif lo.min() >= size:          # 0 clashes with nothing (with no hint, an interval that starts
        return 0                    # below size holds the byte at 0 or above it)
    order = np.argsort(lo)
    prefix_end = np.concatenate(([-1], np.maximum.accumulate(le[order])))
    clash = prefix_end[np.searchsorted(lo[order], cand + size, "left")] > cand
    return int(cand[~clash].min())              # the highest end always fits


def _exempt_interval(lo, le, size, oks):
    """The interval that clashes with an offset exactly where an exempt one does (no hint allows it)."""
    for low, high in oks:
        if low is not None:
            le = min(le, low)
        else:
            lo = max(lo, high + size)
    return lo, le


def _lowest_fit_small(lo, le, size, align, extra, exempt):
    """``_lowest_fit`` on Python lists, for a few live intervals."""
    cands = {0, *extra}
    cands.update(-(-e // align) * align for e in le)
    for i, oks in exempt.items():
        lo[i], le[i] = _exempt_interval(lo[i], le[i], size, oks)
    ivs = sorted(zip(lo, le))
    los = [a for a, _ in ivs]
    ends = list(itertools.accumulate((e for _, e in ivs), max))
    for c in sorted(cands):
        k = bisect.bisect_left(los, c + size)
        if not k or ends[k - 1] <= c:
            return c
    raise AssertionError("unreachable: the highest end always fits")


def _place(buffers, perm, rel, neighbours):
    """Offsets of ``buffers`` placed in the order ``perm`` (indices into ``buffers``); ``rel``:
    {index: [(other index, min shift, this is the output)]} from the in-place hints;
    ``neighbours``: ``_neighbours(buffers)``."""
    n = len(buffers)
    first = np.array([b.first for b in buffers], np.int64)
    last = np.array([b.last for b in buffers], np.int64)
    rank = np.full(n, n, np.int64)         # placement step of each buffer (n: not yet placed)
    po, pe = np.zeros(n, np.int64), np.zeros(n, np.int64)        # offset and end of placed buffers
    offsets = {}
    for step, k in enumerate(perm):
        b = buffers[k]
        if b.size == 0:
            offsets[b.name] = 0
            continue
        nb = neighbours[k]
        if nb is None:
            live = np.flatnonzero((rank < step) & (first <= b.last) & (last >= b.first))
        else:
            live = nb[rank[nb] < step]
        extra, exempt = [], {}             # hint candidates; index in live -> [(lowest, highest ok offset)]
        for j, shift, b_out in rel.get(k, ()):
            o = buffers[j]
            if rank[j] >= step or not (o.first <= b.last and o.last >= b.first):
                continue
            oj = int(po[j])
            if b_out:     # b may start ``shift`` bytes or more below the input it overwrites
                extra.append(max(0, _align_down(oj - shift, b.align)))
                ok = (None, oj - shift)
            else:         # the output j may start ``shift`` bytes or more below b
                extra.append(_align_up(oj + shift, b.align))
                ok = (oj + shift, None)
            exempt.setdefault(int(np.searchsorted(live, j)), []).append(ok)
        off = _lowest_fit(po[live], pe[live], b.size, b.align, extra, exempt)
        offsets[b.name] = off
        rank[k], po[k], pe[k] = step, off, off + b.size
    return offsets


def _relations(buffers, aliases):
    index = {b.name: k for k, b in enumerate(buffers)}
    rel = {}
    for a in aliases:
        rel.setdefault(index[a.out], []).append((index[a.inp], a.min_shift, True))
        rel.setdefault(index[a.inp], []).append((index[a.out], a.min_shift, False))
    return rel


def _greedy(order, aliases):
    """Place the buffers of ``order`` one after the other, each at the lowest candidate offset
    (0, just above a live placed buffer, or where an in-place hint allows) where it overlaps no
    live placed buffer other than as an in-place hint allows: (offsets, peak)."""
    offsets = _place(order, range(len(order)), _relations(order, aliases), _neighbours(order))
    return offsets, _peak(order, offsets)


def _peak(buffers, offsets):
    return max((offsets[b.name] + b.size for b in buffers), default=0)


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
    by_name = {b.name: b for b in buffers}
    for a in aliases:
        bo, bi = by_name[a.out], by_name[a.inp]
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
    index = {b.name: k for k, b in enumerate(buffers)}
    neighbours, rel = _neighbours(buffers), _relations(buffers, aliases)    # shared by every strategy
    for name, order, al in cands:
        offsets = _place(buffers, [index[b.name] for b in order], rel if al else {}, neighbours)
        peak = _peak(buffers, offsets)
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
