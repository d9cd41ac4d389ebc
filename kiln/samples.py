"""Sample files: the inputs (and expected results) a user feeds `kiln quantize --data`,
`kiln run --data`, `kiln golden --data` and `kiln verify --golden`, for models with one or
several inputs and outputs.

Two layouts of one .npz, told apart by their array names:

- **Golden pairs** (what `kiln golden` writes and `kiln verify` reads): ``in_K`` / ``out_K`` for
  pair K of a single-input, single-output model; ``in_K_J`` / ``out_K_J`` for input / output J of
  pair K of a model with several inputs or outputs. Each array is one sample, shaped like the
  model's input or output (batch dimension included).
- **Data arrays** (a dataset, samples stacked on the first axis): the inputs as ``x`` (one input),
  or one array per input named after the model's input (``kiln inspect`` lists the names), or
  ``x_0``, ``x_1``, ... in input order. Optional expected results: ``y`` (integer class labels
  [N], or the expected outputs of a one-output model [N, ...]), or ``y_0``, ``y_1``, ... / the
  output names for several outputs. ``kiln train``'s layout (``x_train``, ``y_train``,
  ``x_test``, ``y_test``) is read too: the test split when present, else the training split.

Float data fed to an int8 input is quantised with the input's scale and zero point (TFLite's
QUANTIZE: round half away from zero, clamp); integer data for an int8 input is taken as it is.
"""
from __future__ import annotations

import dataclasses
import os
import re
import zipfile

import numpy as np

from kiln.frontend.errors import KilnError
from kiln.frontend.ops.quant import quantize_array

_PAIR = re.compile(r"^(in|out)_(\d+)(?:_(\d+))?$")


class SampleError(KilnError):
    """A sample file that cannot be read or does not fit the model; says which array and why."""


@dataclasses.dataclass
class Samples:
    """``inputs[k]`` is sample k: a tuple with one array per model input (model shapes).
    ``targets[k]`` is None, an int class label, or a tuple of expected output arrays."""
    inputs: list
    targets: list | None
    kind: str            # "golden" (expected outputs), "labels", "outputs" (expected outputs), "inputs"
    source: str

    def __len__(self):
        return len(self.inputs)

    @property
    def labels(self):
        return None if self.kind != "labels" else np.asarray(self.targets)


def read_npz(path) -> dict:
    path = os.fspath(path)
    if not os.path.exists(path):
        raise SampleError(f"sample file {path} not found")
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise SampleError(f"{path}: not a readable .npz ({type(e).__name__}: {e})") from None


def is_golden(arrays) -> bool:
    return any(_PAIR.match(k) for k in arrays)


def golden_pairs(arrays, path="golden") -> list[tuple[tuple, tuple]]:
    """[(inputs, outputs)] from in_K/out_K or in_K_J/out_K_J arrays, pairs in order of K and
    arrays in order of J."""
    table: dict[tuple[str, int], dict[int, np.ndarray]] = {}
    for k, v in arrays.items():
        m = _PAIR.match(k)
        if not m:
            continue
        side, pair, j = m.group(1), int(m.group(2)), m.group(3)
        slot = table.setdefault((side, pair), {})
        j = -1 if j is None else int(j)
        if (j == -1 and slot) or (j != -1 and -1 in slot):
            raise SampleError(f"{path}: pair {pair} mixes {side}_{pair} and {side}_{pair}_J names")
        slot[j] = v
    pairs = sorted({p for _, p in table})
    if not pairs:
        raise SampleError(f"{path}: no in_K/out_K (or in_K_J/out_K_J) arrays found (have: {sorted(arrays)})")
    out = []
    for p in pairs:
        if ("in", p) not in table or ("out", p) not in table:
            missing = "out" if ("in", p) in table else "in"
            raise SampleError(f"{path}: pair {p} has no {missing}_{p} array")
        sides = []
        for side in ("in", "out"):
            slot = table[(side, p)]
            idx = sorted(slot)
            if idx != [-1] and idx != list(range(len(idx))):
                raise SampleError(f"{path}: {side}_{p}_J arrays must be numbered 0..{len(idx) - 1}, got {idx}")
            sides.append(tuple(slot[j] for j in idx))
        out.append((sides[0], sides[1]))
    return out


def golden_arrays(pairs) -> dict:
    """The inverse of :func:`golden_pairs`: in_K/out_K when every pair has one input and one
    output, in_K_J/out_K_J otherwise."""
    single = all(len(i) == 1 and len(o) == 1 for i, o in pairs)
    arrs = {}
    for k, (ins, outs) in enumerate(pairs):
        for side, vals in (("in", ins), ("out", outs)):
            for j, v in enumerate(vals):
                arrs[f"{side}_{k}" if single else f"{side}_{k}_{j}"] = np.asarray(v)
    return arrs


def _fit_input(a, t, what):
    """One sample for a model input of type ``t``: reshaped to the model's shape, quantised when
    float data meets an int8 input."""
    a = np.asarray(a)
    if a.size != int(np.prod(t.shape)):
        raise SampleError(f"{what}: {a.size} values of shape {a.shape}, the model input {t} takes "
                          f"{int(np.prod(t.shape))}")
    a = a.reshape(t.shape)
    if t.dtype in ("int8", "int16", "uint8") and a.dtype.kind == "f":
        if t.quant is None:
            raise SampleError(f"{what}: float data for an integer input without quantisation parameters")
        return quantize_array(a, t.quant.scale[0], t.quant.zero_point[0], t.dtype)
    if a.dtype.kind not in "fiub":
        raise SampleError(f"{what}: {a.dtype} data")
    return a.astype(t.dtype, copy=False)


def _input_arrays(arrays, graph, path):
    names = graph.inputs
    if len(names) == 1:
        for key in ("x", "x_test", "x_train", names[0], "x_0"):
            if key in arrays:
                return [key]
        raise SampleError(f"{path}: no input array: expected 'x' (or x_test / x_train, "
                          f"{names[0]!r}, x_0); found {sorted(arrays)}")
    if all(n in arrays for n in names):
        return list(names)
    keys = [f"x_{j}" for j in range(len(names))]
    if all(k in arrays for k in keys):
        return keys
    raise SampleError(f"{path}: the model has {len(names)} inputs ({', '.join(names)}): give one array per "
                      f"input named after it, or x_0..x_{len(names) - 1}; found {sorted(arrays)}")


def _target_arrays(arrays, graph, input_keys):
    outs = graph.outputs
    split = "_test" if input_keys == ["x_test"] else "_train" if input_keys == ["x_train"] else ""
    if f"y{split}" in arrays:
        return [f"y{split}"]
    if len(outs) > 1 or "y_0" in arrays:
        keys = [f"y_{j}" for j in range(len(outs))]
        if all(k in arrays for k in keys):
            return keys
        if all(o in arrays for o in outs):
            return list(outs)
    return None


def load_samples(path, graph, limit=None) -> Samples:
    """Samples for ``graph`` from a golden-pair or data-array .npz (see the module docstring)."""
    arrays = read_npz(path)
    path = os.fspath(path)
    types = [graph.types[i] for i in graph.inputs]
    if is_golden(arrays):
        pairs = golden_pairs(arrays, path)[:limit]
        ins = []
        for k, (xs, _) in enumerate(pairs):
            if len(xs) != len(types):
                raise SampleError(f"{path}: pair {k} has {len(xs)} inputs, the model takes {len(types)}")
            ins.append(tuple(_fit_input(a, t, f"{path}: in_{k}" + (f"_{j}" if len(xs) > 1 else ""))
                             for j, (a, t) in enumerate(zip(xs, types))))
        return Samples(ins, [o for _, o in pairs], "golden", path)
    keys = _input_arrays(arrays, graph, path)
    n = {len(arrays[k]) for k in keys}
    if len(n) != 1:
        raise SampleError(f"{path}: input arrays {keys} hold different numbers of samples ({sorted(n)})")
    n = n.pop() if limit is None else min(n.pop(), limit)
    ins = [tuple(_fit_input(arrays[k][i], t, f"{path}: {k}[{i}]") for k, t in zip(keys, types)) for i in range(n)]
    tkeys = _target_arrays(arrays, graph, keys)
    if tkeys is None:
        return Samples(ins, None, "inputs", path)
    ys = [arrays[k][:n] for k in tkeys]
    if len(ys) == 1 and ys[0].ndim == 1 and ys[0].dtype.kind in "iu" and len(graph.outputs) == 1 and \
            int(np.prod(graph.types[graph.outputs[0]].shape)) > 1:
        return Samples(ins, [int(v) for v in ys[0]], "labels", path)
    otypes = [graph.types[o] for o in graph.outputs]
    if len(ys) != len(otypes):
        raise SampleError(f"{path}: {len(ys)} expected-output arrays for a model with {len(otypes)} outputs")
    targets = [tuple(np.asarray(y[i]).reshape(t.shape) for y, t in zip(ys, otypes)) for i in range(n)]
    return Samples(ins, targets, "outputs", path)


def random_inputs(graph, n, seed=0, int_ranges=None) -> list[tuple]:
    """n seeded random samples: uniform over the integer range of integer inputs, standard normal
    for float inputs (one tuple of arrays per sample). ``int_ranges``: {dtype: (low, high)},
    inclusive bounds for the inputs of those integer dtypes instead of their whole range (e.g.
    ``{"int32": (-1000, 1000)}``: int32 inputs are often indices or counts)."""
    int_ranges = {np.dtype(dt).name: r for dt, r in (int_ranges or {}).items()}
    for dt, (lo, hi) in int_ranges.items():
        if np.dtype(dt).kind not in "iu":
            raise SampleError(f"random_inputs: int_ranges[{dt!r}]: {dt} is not an integer dtype")
        info = np.iinfo(dt)
        if not info.min <= lo <= hi <= info.max:
            raise SampleError(f"random_inputs: int_ranges[{dt!r}] = ({lo}, {hi}) must satisfy "
                              f"{info.min} <= low <= high <= {info.max}")
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        xs = []
        for name in graph.inputs:
            t = graph.types[name]
            if np.dtype(t.dtype).kind in "iu":
                info = np.iinfo(t.dtype)
                lo, hi = int_ranges.get(t.dtype, (info.min, info.max))
                xs.append(rng.integers(lo, hi + 1, t.shape).astype(t.dtype))
            elif t.dtype == "bool":
                xs.append(rng.integers(0, 2, t.shape).astype(bool))
            else:
                xs.append(rng.standard_normal(t.shape).astype(t.dtype))
        out.append(tuple(xs))
    return out
