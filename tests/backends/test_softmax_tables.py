"""int8 softmax in the C backend: one trimmed exp table (no 'expsum' table), bit-exact with the
int8 reference over many random rows and input scales (diff_min below, at and above -255; the
table starts at the first difference whose sum term is non-zero)."""
import dataclasses
import os
import re

import numpy as np
import pytest

from kiln.backends import compile as compile_pkg
from kiln.backends import cpus
from kiln.backends.ops_misc import softmax_exp_table
from kiln.frontend import Graph, QParams, TensorType
from kiln.frontend import fixedpoint as fp
from kiln.frontend.ops.reduce_shape import (
    SOFTMAX_ACCUMULATION_INTEGER_BITS,
    SOFTMAX_SCALED_DIFF_INTEGER_BITS,
    softmax_int8_rows,
    softmax_params,
)

RNG = np.random.default_rng(11)
RN8_SCALE, KWS_SCALE = 0.17185351252555847, 0.14469251036643982   # the shared models' softmax inputs
# (input scale, row shape): diff_min -1984 / -496 (< -255: full table), -248 (> -255), -248 with
# exp underflowing to 0 below d = -221, -124 (the shared models), -31, -7
CASES = [(0.01, (256, 10)), (0.05, (16, 16, 12)), (0.08, (128, 33)), (0.1, (256, 7)), (RN8_SCALE, (512, 10)),
         (KWS_SCALE, (512, 12)), (0.5, (128, 5)), (2.0, (32, 2, 9)), (0.2, (64, 1)), (0.1, (48, 250)),
         (RN8_SCALE, (48, 250))]


def q(scale, zp):
    return QParams((scale,), (zp,))


def reference_exp(scale):
    """(d, exp(d)) for every int8 difference d, as the reference uses it (0 below diff_min)."""
    mult, left, diff_min = softmax_params(scale)
    d = np.arange(-255, 1)
    e = fp.exp_on_negative_values(fp.multiply_by_quantized_multiplier_greater_than_one(d, mult, left),
                                  SOFTMAX_SCALED_DIFF_INTEGER_BITS)
    return d, np.where(d >= diff_min, e, 0)


def expected_entries(scale):
    """Table length from the reference alone: the differences in [max(diff_min, -255), 0] from
    the first one whose sum term (e + 2^11) >> 12 is non-zero on, plus one zero entry unless
    every int8 difference is covered."""
    d, e = reference_exp(scale)
    lo = d[(e + 2048) >> 12 != 0].min()
    assert lo >= max(softmax_params(scale)[2], -255)
    return -lo + 1 + (lo > -255)


def rows(shape):
    """Random int8 rows of three kinds: uniform over int8 (differences down to -255); clustered
    below their maximum (differences spread around diff_min and the table's first entries); and a
    few entries at the maximum over a tail of small exps, whose sum terms (or their absence) move
    the outputs."""
    n = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    D = shape[-1]
    uniform = RNG.integers(-128, 128, size=(n, D))
    top = RNG.integers(-128, 128, size=(n, 1))
    spread = RNG.integers(0, 300, size=(n, 1))
    near = top - (RNG.random((n, D)) * (spread + 1)).astype(np.int64)
    tail = np.where(RNG.random((n, D)) < 0.1, top, top - RNG.integers(40, 256, size=(n, D)))
    kind = RNG.integers(0, 3, size=(n, 1))
    x = np.where(kind == 0, uniform, np.where(kind == 1, near, tail))
    x[0] = 127
    x[0, 0] = -128                      # d = -255 with every other entry at the maximum
    return np.clip(x, -128, 127).astype(np.int8).reshape(shape)


@pytest.fixture(scope="module", params=[True, False], ids=["kiln_softmax_s8", "tvm-stages"])
def softmax_pkg(tmp_path_factory, request):
    """The C helper, and TVM's per-row stages (the path of a softmax fused behind another op)."""
    return _softmax_pkg(tmp_path_factory, request.param)


def _softmax_pkg(tmp_path_factory, helper):
    g = Graph("softmax_tables")
    for k, (scale, shape) in enumerate(CASES):
        g.add_input(f"x{k}", TensorType(shape, "int8", q(scale, int(RNG.integers(-20, 20)))))
        g.add_node("softmax", [f"x{k}"], {"axis": -1}, name=f"sm{k}",
                   out_type=TensorType(shape, "int8", q(1 / 256, -128)))
    g.outputs = [f"sm{k}" for k in range(len(CASES))]
    out = tmp_path_factory.mktemp("softmax_tables")
    target = dataclasses.replace(cpus.get("host"), softmax_helper=helper)
    pkg = compile_pkg(g, target=target, out_dir=out, plot=False, measure_size=False)
    assert ("kiln_softmax_s8(" in (out / "kernels.c").read_text()) == helper
    return g, pkg, out


def test_softmax_bit_exact_with_reference(softmax_pkg):
    g, pkg, _ = softmax_pkg
    for trial in range(8):
        xs = [rows(shape) for _, shape in CASES]
        got = pkg.run(*xs)
        for (scale, _), x, gt in zip(CASES, xs, got):
            want = softmax_int8_rows(x, scale)
            assert gt.dtype == np.int8
            np.testing.assert_array_equal(gt, want, err_msg=f"input scale {scale}, trial {trial}")


def test_one_trimmed_exp_table_per_softmax(softmax_pkg):
    g, pkg, out = softmax_pkg
    model_c = (out / "model.c").read_text()
    kernels_c = (out / "kernels.c").read_text()
    assert "expsum" not in model_c and "expsum" not in kernels_c
    tables = dict(re.findall(r"static const int32_t c_(sm\d+)_exp\[(\d+)\]", model_c))
    # constant arrays are stored once by content: a softmax whose input scale an earlier one has
    # reads that one's table (the last two cases repeat sm3's and sm4's scales)
    first = {}
    for k, (scale, _) in enumerate(CASES):
        first.setdefault(scale, k)
    assert sorted(tables) == sorted(f"sm{k}" for k in first.values()), tables
    for scale, k in first.items():
        n = expected_entries(scale)
        assert int(tables[f"sm{k}"]) == n, (scale, tables[f"sm{k}"], n)
        assert len(softmax_exp_table(*softmax_params(scale))[1]) == n
    # the cases cover diff_min < -255 (full table), diff_min > -255, and the shared models' -124
    assert int(tables["sm0"]) == 256 and 0 < int(tables["sm2"]) < 256
    assert int(tables["sm4"]) == 82 and int(tables["sm5"]) == 97          # ResNet-8, KWS
    assert pkg.manifest.weight_bytes == 4 * sum(int(v) for v in tables.values())


@pytest.mark.parametrize("scale", [0.003, 0.01, 0.05, 0.08, 0.1, 0.125, 0.15, RN8_SCALE, KWS_SCALE, 0.2, 0.25,
                                   0.5, 1.0, 2.0, 7.5])
def test_sum_term_is_rounded_shift_of_exp(scale):
    """The accumulator term the kernel computes from exp, SaturatingRoundingMultiplyByPOT<-12>,
    is (e + 2^11) >> 12 for every tabulated e >= 0, and the table matches the reference's exp at
    every int8 difference it covers."""
    mult, left, diff_min = softmax_params(scale)
    lo, tab = softmax_exp_table(mult, left, diff_min)
    e = tab.astype(np.int64)
    assert (e >= 0).all()
    acc = SOFTMAX_ACCUMULATION_INTEGER_BITS
    np.testing.assert_array_equal(fp.saturating_rounding_multiply_by_pot(e, -acc),
                                  (e + (1 << (acc - 1))) >> acc)
    # the kernel adds in uint32: no wrap even for e = INT32_MAX
    assert ((e + (1 << (acc - 1))) < (1 << 32)).all()
    d, ref = reference_exp(scale)
    idx = d + 255 if lo == -255 else np.maximum(d, lo - 1) - (lo - 1)
    kept = d >= lo
    np.testing.assert_array_equal(e[idx][kept], ref[kept])
    # below lo the kernel reads 0 where the reference may have a small exp: the same bits, since
    # its sum term is 0 and SRDHM(scale, e) <= e < 2^22 vanishes under the output shift of at
    # least 23 (the row maximum's term alone is 2^19, so the sum has at most 12 leading zeros)
    assert (e[idx][~kept] == 0).all()
    assert (ref[~kept] < 1 << acc - 1).all()
    assert fp.saturating_rounding_multiply_by_pot(fp.INT32_MAX, -acc) == 1 << 19


@pytest.mark.parametrize("model,lo", [("pretrainedResnet_quant", -80), ("kws_ref_model", -95)])
def test_shared_model_softmax_tables(shared_models, model, lo):
    from kiln.frontend.tflite_import import load_tflite
    g = load_tflite(os.path.join(shared_models, model + ".tflite"))
    (node,) = [n for n in g.nodes if n.op == "softmax"]
    mult, left, diff_min = softmax_params(g.types[node.inputs[0]].quant.scale[0])
    got_lo, tab = softmax_exp_table(mult, left, diff_min)
    # diff_min = -124 for both; d in [lo, 0] plus the zero entry
    assert (diff_min, got_lo, len(tab)) == (-124, lo, -lo + 2)
