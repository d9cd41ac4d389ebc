"""Dynamic-range ("hybrid") models: float activations, int8 constant weights with per-tensor or
per-channel scales (and explicit DEQUANTIZE of int8 or float16 constants). Kiln imports them as
float models with the weights dequantised as TFLite's DEQUANTIZE computes them."""
import numpy as np
import pytest

from kiln.backends import compile as compile_pkg
from kiln.backends.host import HostModel
from kiln.frontend import run
from kiln.frontend.tflite_import import load_tflite
from tests.frontend.tflite_builder import Builder
from tests.quantize.litert_util import litert_run

RNG = np.random.default_rng(11)
CONV_W = RNG.integers(-127, 128, (4, 3, 3, 3))
CONV_S = RNG.uniform(0.002, 0.01, 4)
DW_W = RNG.integers(-127, 128, (1, 3, 3, 4))
DW_S = RNG.uniform(0.01, 0.03, 4)
FC_W = RNG.integers(-127, 128, (5, 256))
FC_S = 0.004
BIAS = {"conv": RNG.normal(size=4), "dw": RNG.normal(size=4), "fc": RNG.normal(size=5)}


def model(explicit=False, fc_fp16=False, w_zp=0):
    """x float[1,8,8,3] -> CONV_2D 3x3 + RELU -> DEPTHWISE_CONV_2D 3x3 -> RESHAPE [1,256] ->
    FULLY_CONNECTED 5 -> float[1,5]. Hybrid: the ops read int8 weights; ``explicit``: DEQUANTIZE ops
    turn them into float tensors first (``fc_fp16``: the FC weights are a float16 constant)."""
    b = Builder("hybrid")
    x = b.tensor("x", (1, 8, 8, 3))

    def weight(name, data, scale, axis):
        q = b.tensor(name + "_q", data.shape, "int8", data, scale=scale, zero_point=w_zp, axis=axis)
        if not explicit:
            return q
        f = b.tensor(name, data.shape)
        b.op("DEQUANTIZE", [q], [f], "DequantizeOptions")
        return f

    cw = weight("conv_w", CONV_W, CONV_S, 0)
    cb = b.tensor("conv_b", (4,), "float32", BIAS["conv"])
    h1 = b.tensor("h1", (1, 8, 8, 4))
    b.op("CONV_2D", [x, cw, cb], [h1], "Conv2DOptions", Padding=0, StrideW=1, StrideH=1, FusedActivationFunction=1)
    dw = weight("dw_w", DW_W, DW_S, 3)
    db = b.tensor("dw_b", (4,), "float32", BIAS["dw"])
    h2 = b.tensor("h2", (1, 8, 8, 4))
    b.op("DEPTHWISE_CONV_2D", [h1, dw, db], [h2], "DepthwiseConv2DOptions", Padding=0, StrideW=1, StrideH=1,
         DepthMultiplier=1)
    shape = b.tensor("shape", (2,), "int32", [1, 256])
    h3 = b.tensor("h3", (1, 256))
    b.op("RESHAPE", [h2, shape], [h3], "ReshapeOptions", NewShape=[1, 256])
    if fc_fp16:
        w16 = b.tensor("fc_w16", FC_W.shape, "float16", (FC_W * FC_S).astype(np.float16))
        fw = b.tensor("fc_w", FC_W.shape)
        b.op("DEQUANTIZE", [w16], [fw], "DequantizeOptions")
    else:
        fw = weight("fc_w", FC_W, FC_S, None)
    fb = b.tensor("fc_b", (5,), "float32", BIAS["fc"])
    y = b.tensor("y", (1, 5))
    b.op("FULLY_CONNECTED", [h3, fw, fb], [y], "FullyConnectedOptions", FusedActivationFunction=0)
    return b.build([x], [y])


def inputs(n=4, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, 8, 8, 3)).astype(np.float32) for _ in range(n)]


def test_hybrid_imports_as_a_float_model():
    g = load_tflite(model())
    assert all(g.types[v].dtype == "float32" and g.types[v].quant is None for v in g.types)
    assert [n.op for n in g.nodes] == ["conv2d", "conv2d", "reshape", "dense"]
    w = g.consts[g.nodes[0].inputs[1]]
    want = (np.float32(CONV_S.astype(np.float32)[:, None, None, None]) * CONV_W).astype(np.float32)
    np.testing.assert_array_equal(w, want)


def test_dequantised_weights_are_litert_dequantize_bits():
    """Kiln's constants equal LiteRT's DEQUANTIZE outputs bit for bit (int8 per channel, per
    tensor and float16)."""
    interp = pytest.importorskip("ai_edge_litert.interpreter")
    for fp16 in (False, True):
        data = model(explicit=True, fc_fp16=fp16)
        it = interp.Interpreter(model_content=data, experimental_op_resolver_type=interp.OpResolverType.BUILTIN_REF,
                                experimental_preserve_all_tensors=True)
        it.allocate_tensors()
        it.set_tensor(it.get_input_details()[0]["index"], inputs(1)[0])
        it.invoke()
        lit = {d["name"]: it.get_tensor(d["index"]) for d in it.get_tensor_details() if d["name"].endswith("_w")}
        g = load_tflite(data)
        conv_w = g.consts[g.nodes[0].inputs[1]]
        dw_w = g.consts[g.nodes[1].inputs[1]]
        fc_w = g.consts[g.nodes[3].inputs[1]]
        np.testing.assert_array_equal(conv_w, lit["conv_w"])
        np.testing.assert_array_equal(dw_w, np.transpose(lit["dw_w"], (3, 1, 2, 0)))
        np.testing.assert_array_equal(fc_w, lit["fc_w"])


def test_hybrid_equals_explicit_dequantize_and_litert_float_kernels():
    hybrid, explicit = load_tflite(model()), load_tflite(model(explicit=True))
    for x in inputs():
        k = run(hybrid, x)[0]
        np.testing.assert_array_equal(k, run(explicit, x)[0])
        np.testing.assert_allclose(k, litert_run(model(explicit=True), [x])[0], rtol=1e-5, atol=1e-5)


def test_hybrid_against_litert_hybrid_kernels():
    """LiteRT's hybrid kernels quantise the activations to int8 on the fly (per batch), so they
    are not a float computation: Kiln's float result lies within a few percent (docs/int8_ir.md
    gives the figures measured on MLPerf Tiny's hybrid models)."""
    g, data = load_tflite(model()), model()
    k = np.stack([run(g, x)[0] for x in inputs(16)])
    lit = np.stack([litert_run(data, [x])[0] for x in inputs(16)])
    rel = np.sqrt(np.mean((k - lit) ** 2)) / np.sqrt(np.mean(lit ** 2))
    assert 0 < rel < 0.05, rel


def test_hybrid_weights_must_be_symmetric():
    with pytest.raises(Exception, match="zero_point 3 is out of range: allowed 0"):
        load_tflite(model(w_zp=3))
    load_tflite(model(explicit=True, w_zp=3))       # an explicit DEQUANTIZE subtracts the zero point


def test_hybrid_compiles_and_runs_on_the_host(tmp_path):
    g = load_tflite(model())
    pkg = compile_pkg(g, target="host", out_dir=str(tmp_path), plot=False)
    x = inputs(1)[0]
    np.testing.assert_allclose(HostModel(pkg.path).run(x)[0], run(g, x)[0], rtol=1e-5, atol=1e-5)
