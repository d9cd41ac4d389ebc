"""A quantized_dimension beyond a tensor's rank where it carries no information: one scale per tensor,
or one scale per element of a rank-1 tensor (TOCO wrote quantized_dimension 3 on the per-channel
conv biases of TFLite Micro's person_detect.tflite). TFLite Micro runs such files (its loader does
not check the field, its kernels never read a bias's quantisation); LiteRT's loader refuses them.
Kiln follows TFLite Micro; the oracle is LiteRT on a copy with the field set to 0 (the tensor's only
axis), which changes nothing else: kiln.litert (``kiln golden``, ``kiln verify``) makes that copy."""
import os

import numpy as np
import pytest
import tflite

from kiln.backends import compile as compile_pkg
from kiln.frontend import run
from kiln.frontend.tflite_import import TFLiteImportError, load_tflite
from kiln.litert import litert_loadable, run_litert
from tests.frontend.tflite_builder import Builder, int8_conv_model, patch
from tests.quantize.litert_util import assert_same, litert_run

PERSON_DETECT = "/work/ext/tflm/tensorflow/lite/micro/models/person_detect.tflite"


def toco_conv_model(depthwise, seed=0, x_axis=None):
    """input int8[1,8,8,4] -> (DEPTHWISE_)CONV_2D 3x3 SAME with per-channel filters and a per-channel
    bias whose quantized_dimension is 3, as TOCO wrote them."""
    rng = np.random.default_rng(seed)
    b = Builder("toco")
    ws = rng.uniform(0.005, 0.02, 4)
    x = b.tensor("x", (1, 8, 8, 4), "int8", scale=0.1, zero_point=3, axis=x_axis)
    wshape = (1, 3, 3, 4) if depthwise else (4, 3, 3, 4)
    w = b.tensor("w", wshape, "int8", rng.integers(-127, 128, wshape), scale=ws, axis=3 if depthwise else 0)
    bi = b.tensor("b", (4,), "int32", rng.integers(-500, 500, 4), scale=0.1 * ws, axis=3)
    y = b.tensor("y", (1, 8, 8, 4), "int8", scale=0.05, zero_point=-5)
    common = dict(Padding=0, StrideW=1, StrideH=1, DilationWFactor=1, DilationHFactor=1, FusedActivationFunction=0)
    if depthwise:
        b.op("DEPTHWISE_CONV_2D", [x, w, bi], [y], "DepthwiseConv2DOptions", True, DepthMultiplier=1, **common)
    else:
        b.op("CONV_2D", [x, w, bi], [y], "Conv2DOptions", True, **common)
    return b.build([x], [y])


@pytest.mark.parametrize("depthwise", [False, True])
def test_rank1_bias_with_toco_quantized_dimension_imports_and_matches_litert(depthwise, tmp_path):
    data = toco_conv_model(depthwise)
    assert tflite.Model.GetRootAsModel(data, 0).Subgraphs(0).Tensors(2).Quantization().QuantizedDimension() == 3
    g = load_tflite(data)
    pkg = compile_pkg(g, target="host", out_dir=tmp_path, plot=False, measure_size=False)
    rng = np.random.default_rng(3)
    for _ in range(3):
        x = rng.integers(-128, 128, (1, 8, 8, 4)).astype(np.int8)
        want = litert_run(litert_loadable(data), [x])[0]
        assert_same(run(g, x)[0], want, "reference")
        assert_same(pkg.run(x)[0], want, "host C")


def test_per_tensor_scale_with_stray_quantized_dimension_imports():
    data = toco_conv_model(False, x_axis=7)         # the input: one scale, quantized_dimension 7
    assert tflite.Model.GetRootAsModel(data, 0).Subgraphs(0).Tensors(0).Quantization().QuantizedDimension() == 7
    x = np.random.default_rng(0).integers(-128, 128, (1, 8, 8, 4)).astype(np.int8)
    assert_same(run(load_tflite(data), x)[0], litert_run(litert_loadable(data), [x])[0], "reference")


def test_per_channel_filter_axis_beyond_rank_still_rejected():
    """A rank-4 filter with 4 scales: the axis decides which channel each scale belongs to."""
    with pytest.raises(TFLiteImportError, match=r"tensor 1 \('w'\): quantized_dimension = 4 is out of range"):
        load_tflite(patch(int8_conv_model(depthwise=True), "tensor 1.quantized_dimension", 4))


def test_negative_quantized_dimension_still_rejected():
    with pytest.raises(TFLiteImportError, match=r"tensor 2 \('b'\): quantized_dimension = -1 is out of range"):
        load_tflite(patch(toco_conv_model(False), "tensor 2.quantized_dimension", -1))


needs_person_detect = pytest.mark.skipif(not os.path.exists(PERSON_DETECT), reason="TFLite Micro checkout absent")


@needs_person_detect
@pytest.mark.slow
def test_tflm_person_detect_reference_and_host_c_match_litert(tmp_path):
    data = open(PERSON_DETECT, "rb").read()
    g = load_tflite(data)
    pkg = compile_pkg(g, target="host", out_dir=tmp_path, plot=False, measure_size=False)
    rng = np.random.default_rng(5)
    for _ in range(3):
        x = rng.integers(-128, 128, (1, 96, 96, 1)).astype(np.int8)
        want = litert_run(litert_loadable(data), [x])[0]
        assert_same(run(g, x)[0], want, "reference")
        assert_same(pkg.run(x)[0], want, "host C")


@needs_person_detect
@pytest.mark.slow
@pytest.mark.qemu
def test_tflm_person_detect_on_board(tmp_path):
    """The file as TFLM ships it: LiteRT's golden outputs (kiln golden) and the mps2-an386 firmware."""
    from kiln.commands.golden import golden
    from kiln.commands.verify import verify
    from kiln.frontend.loader import load_model
    from kiln.samples import random_inputs
    gold = str(tmp_path / "g.npz")
    golden(PERSON_DETECT, gold, random_inputs(load_model(PERSON_DETECT), 2, seed=4))
    rep = verify(PERSON_DETECT, gold, "mps2-an386", options={"out": str(tmp_path / "board")})
    assert rep["ok"] and rep["matched"] == 2, rep["results"]


def test_the_litert_oracle_loads_such_files(tmp_path):
    """kiln.litert (kiln golden / verify) gives LiteRT the loadable copy; other files pass unchanged."""
    data = toco_conv_model(True)
    p = tmp_path / "toco.tflite"
    p.write_bytes(data)
    x = np.random.default_rng(1).integers(-128, 128, (1, 8, 8, 4)).astype(np.int8)
    assert_same(run_litert(p, [(x,)])[0][0], run(load_tflite(data), x)[0], "oracle")
    plain = int8_conv_model()
    assert litert_loadable(plain) is plain


def test_loadable_copy_leaves_other_files_byte_identical():
    """A file whose quantized_dimension fields are absent or in range (a quantised scalar: PADV2's
    constant value) comes back unchanged; writing through an absent field's offset 0 used to
    overwrite the table's first field (here the scalar's zero point)."""
    from kiln.litert import litert_loadable
    from tests.ops_shape.test_composed_model import composed_model
    buf = composed_model()
    assert litert_loadable(buf) == buf
