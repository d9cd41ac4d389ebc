"""Memory planner: hand-checkable cases, in-place aliasing, overlap checker, rendering."""
import pytest

from kiln.backends.planner import Alias, Buffer, MemoryPlan, lifetimes, overlaps, plan, plot


def test_chain_reuses_memory():
    # a -> b -> c: a and c never live together, so c can sit where a was
    bufs = [Buffer("a", 100, 0, 1, 4), Buffer("b", 50, 1, 2, 4), Buffer("c", 100, 2, 3, 4)]
    p = plan(bufs)
    assert p.peak == 150
    assert p.offsets["a"] == p.offsets["c"]
    assert not overlaps(bufs, p.offsets)


def test_greedy_by_size_order_hand_checked():
    # TFLM's greedy-by-size: biggest first at 0, then the next at the lowest free offset
    bufs = [Buffer("x", 40, 0, 2, 4), Buffer("y", 80, 1, 3, 4), Buffer("z", 20, 3, 4, 4)]
    p = plan(bufs, strategies=["greedy_by_size"])
    assert p.offsets == {"y": 0, "x": 80, "z": 80}
    assert p.peak == 120


def test_alignment():
    bufs = [Buffer("a", 3, 0, 1, 16), Buffer("b", 5, 0, 1, 16)]
    p = plan(bufs)
    assert sorted(p.offsets.values()) == [0, 16]
    # either order is aligned; the planner keeps the smaller peak (b at 0, a at 16: 19 bytes)
    assert p.peak == max(p.offsets[b.name] + b.size for b in bufs) == 19
    assert p.arena_bytes == 32


def test_inplace_elementwise_aliases_exactly():
    # relu(x) may overwrite x: the plan needs one buffer, not two
    bufs = [Buffer("x", 64, 0, 1, 4), Buffer("y", 64, 1, 2, 4)]
    no = plan(bufs, strategies=["greedy_by_size"])
    assert no.peak == 128
    yes = plan(bufs, [Alias("y", "x", 0)])
    assert yes.peak == 64 and yes.offsets["x"] == yes.offsets["y"]
    assert yes.strategy.endswith("+inplace")
    assert yes.tried["greedy_by_size"] == 128


def test_inplace_with_shift_places_output_below_input():
    # a depthwise conv that needs its output 12 bytes below its input
    bufs = [Buffer("x", 100, 0, 1, 4), Buffer("y", 100, 1, 2, 4)]
    p = plan(bufs, [Alias("y", "x", 12)])
    assert p.offsets["x"] - p.offsets["y"] >= 12
    assert p.peak == 112


def test_inplace_hint_needs_matching_lifetimes():
    with pytest.raises(ValueError, match="must die where"):
        plan([Buffer("x", 8, 0, 3), Buffer("y", 8, 1, 2)], [Alias("y", "x", 0)])


def test_overlap_checker_finds_conflicts():
    bufs = [Buffer("a", 10, 0, 2, 1), Buffer("b", 10, 1, 3, 1)]
    bad = overlaps(bufs, {"a": 0, "b": 5})
    assert bad and "overlaps" in bad[0]
    assert not overlaps(bufs, {"a": 0, "b": 10})
    # an allowed in-place pair must respect its shift
    assert overlaps(bufs, {"a": 0, "b": 5}, [Alias("b", "a", 0)])
    with pytest.raises(ValueError):
        MemoryPlan(bufs, {"a": 0, "b": 5}, 15).check()


def test_rendering(tmp_path):
    bufs = [Buffer("input", 64, 0, 0, 4), Buffer("conv", 128, 0, 1, 4), Buffer("out", 16, 1, 1, 4)]
    p = plan(bufs)
    txt = p.table()
    assert "input" in txt and "peak" in txt
    assert len(p.drawing().splitlines()) == 2 + 2
    png = plot(p, tmp_path / "m.png")
    assert (tmp_path / "m.png").stat().st_size > 1000 and str(png).endswith(".png")


def test_random_lifetimes_never_overlap():
    import random
    rng = random.Random(1)
    for _trial in range(30):
        bufs, aliases = [], []
        for i in range(12):
            f = rng.randrange(10)
            bufs.append(Buffer(f"b{i}", rng.randrange(1, 300), f, f + rng.randrange(4), 4))
        for i in range(11):
            a, b = bufs[i], bufs[i + 1]
            if a.last == b.first and rng.random() < 0.5:
                aliases.append(Alias(b.name, a.name, rng.choice([0, 8, 40])))
        p = plan(bufs, aliases)
        assert not overlaps(bufs, p.offsets, aliases)
        assert p.peak <= plan(bufs, strategies=["greedy_by_size"]).peak


def test_lifetimes_by_hand():
    """Inputs live from ``born``, a value from the step writing it to its last reader, outputs
    until ``end``; values are listed in the order they are born."""
    steps = [(["x"], ["a"]), (["a"], ["b"]), (["a", "b"], ["c"]), (["c"], ["d"])]
    first, last = lifetimes(["x"], steps, ["b", "d"])
    assert list(first) == ["x", "a", "b", "c", "d"]
    assert first == {"x": 0, "a": 0, "b": 1, "c": 2, "d": 3}
    assert last == {"x": 0, "a": 2, "b": 3, "c": 3, "d": 3}
    first, last = lifetimes(["x"], steps, ["d"], born=-1, end=4)      # the CUDA convention
    assert first["x"] == -1 and last["x"] == 0 and last["d"] == 4


# ---- the vectorised greedy placement against the plain one it replaced ---------------------------
def _greedy_plain(order, aliases):
    """One buffer at a time at the lowest candidate offset that fits (the planner's rule, written
    with plain loops over every placed buffer)."""
    rel = {(a.out, a.inp): a.min_shift for a in aliases}
    offsets, placed = {}, []
    for b in order:
        if b.size == 0:
            offsets[b.name] = 0
            continue
        live = [p for p in placed if b.lives_with(p)]
        cands = {0}
        for p in live:
            op = offsets[p.name]
            cands.add(-(-(op + p.size) // b.align) * b.align)
            if (b.name, p.name) in rel:
                cands.add(max(0, (op - rel[(b.name, p.name)]) // b.align * b.align))
            if (p.name, b.name) in rel:
                cands.add(-(-(op + rel[(p.name, b.name)]) // b.align) * b.align)

        def fits(off):
            for p in live:
                op = offsets[p.name]
                if off < op + p.size and op < off + b.size:
                    s = rel.get((b.name, p.name))
                    if s is not None and op - off >= s:
                        continue
                    s = rel.get((p.name, b.name))
                    if s is not None and off - op >= s:
                        continue
                    return False
            return True
        offsets[b.name] = next(off for off in sorted(cands) if fits(off))
        placed.append(b)
    return offsets, max((offsets[b.name] + b.size for b in order), default=0)


@pytest.mark.parametrize("seed", range(6))
def test_greedy_places_as_the_plain_loop_does(seed):
    import random

    from kiln.backends.planner import ORDERS, _greedy
    rng = random.Random(seed)
    bufs, aliases, t = [], [], 0
    for k in range(120):          # a chain with in-place hints, long-lived outputs and scratch
        first = t
        last = first + rng.choice([0, 1, 1, 2, 5, 40])
        bufs.append(Buffer(f"b{k}", rng.choice([0, 12, 64, 100, 128, 333]), first, last, rng.choice([4, 16])))
        if k and bufs[k - 1].last == first and rng.random() < 0.5:
            aliases.append(Alias(f"b{k}", f"b{k - 1}", rng.choice([0, 8, 32])))
        t += rng.choice([0, 1, 1])
    for name, order in ORDERS.items():
        for al in ((), aliases):
            assert _greedy(order(bufs), al) == _greedy_plain(order(bufs), al), name
    p = plan(bufs, aliases)
    assert not overlaps(bufs, p.offsets, p.aliases)


def _unrolled_rnn(steps, seed):
    """Buffers like a long unrolled RNN's: per step a chain of short-lived values with in-place
    hints, and one output per step that lives to the end (a final CONCATENATION reads them all),
    so hundreds of buffers are live at once."""
    import random
    rng = random.Random(seed)
    bufs, aliases, t = [], [], 0
    end = steps * 4 + 1
    for s in range(steps):
        prev = None
        for k in range(4):
            b = Buffer(f"s{s}_{k}", rng.choice([32, 96, 128, 8]), t, t + 1, rng.choice([4, 16]))
            if prev is not None and prev.last == b.first and rng.random() < 0.7:
                aliases.append(Alias(b.name, prev.name, rng.choice([0, 0, 16])))
            bufs.append(b)
            prev, t = b, t + 1
        bufs.append(Buffer(f"h{s}", 32, t - 1, end, 16))
        bufs.append(Buffer(f"scratch{s}", rng.choice([0, 64]), t - 2, t - 2, 16))
    bufs.append(Buffer("concat", 32 * steps, end, end, 16))
    return bufs, aliases


@pytest.mark.parametrize("seed", range(3))
def test_many_live_buffers_place_as_the_plain_loop_does(seed):
    """Every strategy of ``plan`` (the deterministic orders with and without hints, the random
    orders) gives the plain loop's offsets when hundreds of placed buffers are live."""
    import random

    from kiln.backends.planner import ORDERS, _greedy
    bufs, aliases = _unrolled_rnn(60, seed)
    orders = [order(bufs) for order in ORDERS.values()]
    rng = random.Random(seed)
    for _ in range(3):
        orders.append(rng.sample(bufs, len(bufs)))
    for order in orders:
        for al in ((), aliases):
            assert _greedy(order, al) == _greedy_plain(order, al)
    p = plan(bufs, aliases, random_orders=4)
    assert not overlaps(bufs, p.offsets, p.aliases)
