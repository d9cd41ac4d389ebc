"""``kiln.samples.random_inputs``: seeded random samples per input dtype, with ``int_ranges``
bounding some integer dtypes (what benchmarks/tflm_agreement.py draws its int32 inputs from)."""
import numpy as np
import pytest

from benchmarks.tflm_agreement import INT32_RANGE
from kiln.frontend import Graph, TensorType
from kiln.samples import SampleError, random_inputs


def _graph(dtypes):
    g = Graph("g")
    for k, dt in enumerate(dtypes):
        g.add_input(f"x{k}", TensorType((3, 50), dt))
    g.outputs = list(g.inputs)
    return g


DTYPES = ["int8", "int32", "float32", "bool", "int16", "uint8"]


def _drawn_by_hand(dtypes, n, seed, int32=(-1000, 1000)):
    """What the TFLM agreement sweep drew before it called random_inputs: the same generator calls."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        xs = []
        for dt in dtypes:
            if dt == "int32":
                xs.append(rng.integers(int32[0], int32[1] + 1, size=(3, 50)).astype(np.int32))
            elif dt == "bool":
                xs.append(rng.integers(0, 2, size=(3, 50)).astype(bool))
            elif dt == "float32":
                xs.append(rng.standard_normal((3, 50)).astype(np.float32))
            else:
                info = np.iinfo(dt)
                xs.append(rng.integers(int(info.min), int(info.max) + 1, size=(3, 50)).astype(dt))
        out.append(tuple(xs))
    return out


def test_int_ranges_bound_only_the_named_dtypes():
    g = _graph(DTYPES)
    got = random_inputs(g, 3, seed=5, int_ranges=INT32_RANGE)
    for sample, want in zip(got, _drawn_by_hand(DTYPES, 3, 5)):
        for a, b in zip(sample, want):
            assert a.dtype == b.dtype and np.array_equal(a, b)
    x32 = np.stack([s[1] for s in got])
    assert x32.min() >= -1000 and x32.max() <= 1000 and x32.min() < -500 and x32.max() > 500
    full = np.stack([s[1] for s in random_inputs(g, 3, seed=5)])
    assert np.abs(full.astype(np.int64)).max() > 1 << 20       # without a range: the whole int32 range
    by_type = random_inputs(g, 3, seed=5, int_ranges={np.int32: (-1000, 1000)})      # a NumPy type as the key
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(got, by_type))


@pytest.mark.parametrize("ranges,what", [({"float32": (0, 1)}, "not an integer dtype"),
                                         ({"int8": (-200, 5)}, "-128 <= low <= high <= 127"),
                                         ({"int32": (3, 2)}, "low <= high")])
def test_bad_int_ranges_say_what_is_wrong(ranges, what):
    with pytest.raises(SampleError, match=what):
        random_inputs(_graph(["int8"]), 1, int_ranges=ranges)
