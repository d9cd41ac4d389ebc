"""Malformed .tflite files raise a TFLiteImportError naming the tensor or operator, the field and the
allowed range: one case per rule (what TFLite's verifier, model loader and kernels' Prepare()
reject, and what Kiln refuses where TFLite's behaviour is undefined). The random mutation
campaign over the shared models is test_tflite_campaign.py."""
import math

import numpy as np
import pytest

from kiln.frontend import LimitError
from kiln.frontend.tflite_import import TFLiteImportError, load_tflite, opcode_name
from tests.frontend.tflite_builder import Builder, field, int8_conv_model, option_pos, patch


def reject(data, *fragments):
    with pytest.raises(TFLiteImportError) as e:
        load_tflite(data)
    msg = str(e.value)
    for f in fragments:
        assert f in msg, f"{f!r} not in {msg!r}"
    return msg


def test_the_base_models_import():
    for dw in (False, True):
        g = load_tflite(int8_conv_model(depthwise=dw))
        assert [n.op for n in g.nodes] == ["conv2d"]


# ---- zero points: the dtype's range (int8 zp = 256 was accepted) ------------------------------
@pytest.mark.parametrize("zp, ok", [(256, False), (-129, False), (128, False), (127, True), (-128, True),
                                    (1 << 31, False), (-(1 << 31) - 1, False)])
def test_activation_zero_point_range(zp, ok):
    data = patch(int8_conv_model(), "tensor 0.zero_point[0]", zp)
    if ok:
        load_tflite(data)
    else:
        reject(data, "tensor 0 ('x')", f"zero_point[0] = {zp}", "allowed -128..127")


def test_int32_zero_point_off_by_one():
    """abs(zp) > 1<<31 let -2^31 - 1 .. 2^31 through; int32 bias zero points are checked exactly
    (and TFLite's conv needs 0)."""
    reject(patch(int8_conv_model(), "tensor 2.zero_point[0]", 1 << 31), "zero_point[0] = 2147483648",
           "allowed -2147483648..2147483647")
    reject(patch(int8_conv_model(), "tensor 2.zero_point[0]", 1), "bias zero_point 1", "allowed 0")


# ---- emptied scale / zero-point vectors (silently dropped before) -----------------------------
def test_emptied_scale_vector_on_an_int8_tensor():
    reject(patch(int8_conv_model(), "tensor 0.scale length", 0), "tensor 0 ('x')",
           "int8 without quantisation parameters")
    reject(patch(int8_conv_model(), "tensor 1.scale length", 0), "filter has no quantisation parameters")


def test_emptied_zero_point_vector():
    reject(patch(int8_conv_model(), "tensor 3.zero_point length", 0), "tensor 3 ('y')", "1 scales but 0 zero points")
    reject(patch(int8_conv_model(), "tensor 1.zero_point length", 1), "tensor 1 ('w')", "4 scales but 1 zero points")


# ---- empty subgraphs (compiled to a 0-command package, then IndexError) -----------------------
def test_empty_subgraph():
    reject(patch(int8_conv_model(), "subgraph.operators length", 0), "no operators")


def test_no_inputs_or_outputs():
    reject(patch(int8_conv_model(), "subgraph.inputs length", 0), "no inputs")
    reject(patch(int8_conv_model(), "subgraph.outputs length", 0), "no outputs")


# ---- scales: finite, > 0, not extreme ---------------------------------------------------------
@pytest.mark.parametrize("scale", [float("nan"), float("inf"), -float("inf"), 0.0, -0.1, 1e30, 3.4e38, 1e-40,
                                   1e-45])
def test_scale_range(scale):
    msg = reject(patch(int8_conv_model(), "tensor 0.scale[0]", scale), "tensor 0 ('x')", "scale[0] = ",
                 "allowed finite values in [2^-63, 2^63]")
    assert "out of range" in msg


def test_per_channel_scale_range():
    reject(patch(int8_conv_model(), "tensor 1.scale[2]", 1e-40), "tensor 1 ('w')", "scale[2] = ")


# ---- requantisation multipliers TFLite cannot represent (the shift > 30 case) -----------------
@pytest.mark.parametrize("out_scale", [1e-12, 1e-15])
def test_multiplier_at_or_above_2_to_30(out_scale):
    reject(int8_conv_model(out_scale=out_scale), "operator 0 (CONV_2D)", "requantisation multiplier",
           "allowed below 2^30")


def test_multiplier_just_below_2_to_30_imports():
    # s_in * s_w / s_out just under 2^30 for the largest filter scale (0.1 * 0.02 / s_out)
    load_tflite(int8_conv_model(out_scale=0.1 * 0.0201 / 2 ** 30))


# ---- strides and dilations that would need terabytes -----------------------------------------
@pytest.mark.parametrize("slot, name", [(12, "dilation_w_factor"), (14, "dilation_h_factor")])
@pytest.mark.parametrize("value", [1 << 30, (1 << 31) - 1, 0, -1])
def test_dilation_range(slot, name, value):
    data = bytearray(int8_conv_model(dilation=2))
    import struct
    struct.pack_into("<i", data, option_pos(bytes(data), 0, slot), value)
    reject(bytes(data), "operator 0 (CONV_2D)", f"{name} = {value}", "allowed 1..32767")


@pytest.mark.parametrize("value", [0, -3, 1 << 20])
def test_stride_range(value):
    import struct
    data = bytearray(int8_conv_model(stride=2, depthwise=True))
    struct.pack_into("<i", data, option_pos(bytes(data), 0, 6), value)
    reject(bytes(data), "operator 0 (DEPTHWISE_CONV_2D)", f"stride_w = {value}", "allowed 1..32767")


def test_large_dilation_within_range_hits_the_element_limit():
    import struct
    data = bytearray(int8_conv_model(dilation=2))
    for slot in (12, 14):
        struct.pack_into("<i", data, option_pos(bytes(data), 0, slot), 30000)
    with pytest.raises(TFLiteImportError, match="max_tensor_elements"):
        load_tflite(bytes(data))


# ---- quantised dimensions out of range ---------------------------------------------------------
@pytest.mark.parametrize("qdim", [4, 100, -1, (1 << 31) - 1])
def test_quantized_dimension_range(qdim):
    reject(patch(int8_conv_model(depthwise=True), "tensor 1.quantized_dimension", qdim), "tensor 1 ('w')",
           f"quantized_dimension = {qdim}", "allowed 0..3")


def test_per_channel_scales_on_the_wrong_axis():
    reject(patch(int8_conv_model(depthwise=True), "tensor 1.quantized_dimension", 0), "tensor 1 ('w')",
           "4 per-channel scales on quantized_dimension 0")


# ---- what TFLite's kernels' Prepare() rejects -------------------------------------------------
def test_conv_filter_zero_points_must_be_zero():
    reject(int8_conv_model(w_zp=1), "operator 0 (CONV_2D)", "filter zero_point 1", "allowed 0")
    reject(int8_conv_model(w_zp=1, depthwise=True), "operator 0 (DEPTHWISE_CONV_2D)", "filter zero_point 1")


def test_conv_needs_its_bias():
    reject(int8_conv_model(bias=False), "operator 0 (CONV_2D) has inputs [0, 1]", "expected 3")
    load_tflite(int8_conv_model(bias=False, depthwise=True))    # optional for DEPTHWISE_CONV_2D
    reject(patch(int8_conv_model(), "operator 0.inputs[2]", -1), "operator 0 (CONV_2D) has inputs [0, 1, -1]")


def test_unsupported_fused_activation_and_relu6_bound():
    reject(int8_conv_model(act=2), "fused_activation_function = RELU_N1_TO_1")
    # RELU6: 6 / output scale must fit int32 (TFLite's CalculateActivationRangeQuantized)
    reject(int8_conv_model(act=3, out_scale=1e-9), "RELU6 bound", "does not fit int32")


def _single(opname, x_q, y_q, x_shape=(1, 4), y_shape=(1, 4), options=None, version=2, **fields):
    b = Builder(opname.lower())
    x = b.tensor("x", x_shape, "int8", scale=x_q[0], zero_point=x_q[1])
    y = b.tensor("y", y_shape, "int8", scale=y_q[0], zero_point=y_q[1])
    b.op(opname, [x], [y], options, True, **fields)
    return b.build([x], [y])


def test_softmax_output_quantisation():
    load_tflite(_single("SOFTMAX", (0.1, 0), (1 / 256, -128), options="SoftmaxOptions", Beta=1.0))
    reject(_single("SOFTMAX", (0.1, 0), (1 / 256, 0), options="SoftmaxOptions", Beta=1.0),
           "operator 0 (SOFTMAX)", "output zero_point 0", "allowed -128")
    reject(_single("SOFTMAX", (0.1, 0), (1 / 128, -128), options="SoftmaxOptions", Beta=1.0), "allowed 1/256")
    reject(_single("SOFTMAX", (1e-9, 0), (1 / 256, -128), options="SoftmaxOptions", Beta=1.0),
           "input scale", "above 2^-26")
    # no SoftmaxOptions: TFLite reads beta = 0
    reject(_single("SOFTMAX", (0.1, 0), (1 / 256, -128)), "beta = 0.0")


def test_logistic_output_scale():
    load_tflite(_single("LOGISTIC", (0.1, 0), (1 / 256, -128)))
    reject(_single("LOGISTIC", (0.1, 0), (1 / 255, -128)), "operator 0 (LOGISTIC)", "allowed exactly 1/256")


def test_relu_multiplier():
    load_tflite(_single("RELU", (0.1, 0), (0.1, -128)))
    reject(_single("RELU", (1e6, 0), (1e-6, -128)), "operator 0 (RELU)", "requantisation multiplier")


def test_reshape_keeps_quantisation_and_follows_tflite_shape():
    load_tflite(_single("RESHAPE", (0.1, 0), (0.1, 0), y_shape=(4,), options="ReshapeOptions", NewShape=[4]))
    reject(_single("RESHAPE", (0.1, 0), (0.2, 0), y_shape=(4,), options="ReshapeOptions", NewShape=[4]),
           "operator 0 (RESHAPE)", "copies the raw values")
    reject(_single("RESHAPE", (0.1, 0), (0.1, 0), y_shape=(4,), options="ReshapeOptions", NewShape=[2, 2]),
           "TFLite reshapes to [2, 2]")
    reject(_single("RESHAPE", (0.1, 0), (0.1, 0), y_shape=(4,), options="ReshapeOptions", NewShape=[3]),
           "new shape [3] holds 3 elements")


def test_add_output_multiplier_must_be_below_one():
    b = Builder("add")
    x1 = b.tensor("a", (1, 4), "int8", scale=1.0, zero_point=0)
    x2 = b.tensor("b", (1, 4), "int8", scale=1.0, zero_point=0)
    y = b.tensor("y", (1, 4), "int8", scale=1e-7, zero_point=0)
    b.op("ADD", [x1, x2], [y], "AddOptions", True, FusedActivationFunction=0)
    reject(b.build([x1, x2], [y]), "operator 0 (ADD)", "allowed below 1 (TFLite aborts)")


def test_concatenation_rules():
    def model(y_scale, act):
        b = Builder("cat")
        x1 = b.tensor("a", (1, 2), "int8", scale=0.5, zero_point=1)
        x2 = b.tensor("b", (1, 2), "int8", scale=0.5, zero_point=1)
        y = b.tensor("y", (1, 4), "int8", scale=y_scale, zero_point=1)
        b.op("CONCATENATION", [x1, x2], [y], "ConcatenationOptions", True, Axis=1, FusedActivationFunction=act)
        return b.build([x1, x2], [y])
    load_tflite(model(0.5, 0))
    reject(model(0.25, 0), "operator 0 (CONCATENATION)", "copies the raw values")
    reject(model(0.5, 1), "fused_activation_function = RELU", "allows NONE")


def test_op_versions_tflite_does_not_implement():
    data = int8_conv_model()
    pos, _ = field(data, "operator_code 0.builtin_code")
    # the version field follows in the table; find it through the tflite accessors
    import tflite
    oc = tflite.Model.GetRootAs(data, 0).OperatorCodes(0)
    vpos = oc._tab.Pos + oc._tab.Offset(8)
    b = bytearray(data)
    b[vpos:vpos + 4] = (9).to_bytes(4, "little")
    reject(bytes(b), "operator code 0 (CONV_2D) has version 9", "versions 1..8")
    assert pos


def test_builtin_code_is_read_raw():
    """TFLite resolves max(builtin_code, deprecated_builtin_code); the tflite package's accessor
    returns the deprecated field below 127, so a file whose two fields disagree read as another op."""
    import tflite
    data = patch(int8_conv_model(), "operator_code 0.builtin_code", 22)   # RESHAPE
    assert opcode_name(tflite.Model.GetRootAs(data, 0).OperatorCodes(0)) == "RESHAPE"
    reject(data, "operator code 0 (RESHAPE) has version 3", "versions 1..1")


def test_inputs_that_no_one_produces():
    """TFLite: 'Input tensor lacks data', even for an input Kiln does not read (RESHAPE's shape)."""
    b = Builder("r")
    x = b.tensor("x", (1, 4), "int8", scale=0.1, zero_point=0)
    s = b.tensor("shape", (1,), "int32")          # no data, no producer
    y = b.tensor("y", (4,), "int8", scale=0.1, zero_point=0)
    b.op("RESHAPE", [x, s], [y], "ReshapeOptions", False, NewShape=[4])
    reject(b.build([x], [y]), "operator 0 (RESHAPE) reads tensor 1 ('shape') before any operator produces it")


def test_graph_input_with_constant_data():
    b = Builder("c")
    x = b.tensor("x", (1, 4), "int8", data=np.zeros((1, 4)), scale=0.1, zero_point=0)
    y = b.tensor("y", (1, 4), "int8", scale=0.1, zero_point=0)
    b.op("RELU", [x], [y], None, True)
    reject(b.build([x], [y]), "graph input tensor 0 ('x') holds constant data")


# ---- structure: indices, shapes, buffers, types, the flatbuffer itself ------------------------
@pytest.mark.parametrize("what, value, fragments", [
    ("operator 0.inputs[0]", 7, ["tensor index 7 is out of range"]),
    ("operator 0.outputs[0]", -1, ["tensor index -1 is out of range"]),
    ("operator 1.opcode_index", 5, ["opcode_index = 5 is out of range"]),
    ("tensor 1.buffer", 99, ["buffer = 99 is out of range"]),
    ("subgraph.inputs[0]", 42, ["tensor index 42 is out of range"]),
    ("tensor 0.shape[1]", -1, ["negative or dynamic dimension"]),
    ("tensor 1.shape[1]", 4, ["buffer 1 holds 144 bytes but shape [4, 4, 3, 4]"]),
    ("tensor 0.type", 5, ["type STRING"]),
    ("tensor 3.shape[1]", 9, ["has shape [1, 9, 8, 4] but the op computes [1, 8, 8, 4]"]),
    ("operator_code 0.builtin_code", 30, ["unsupported TFLite op SKIP_GRAM at operator 0", "Kiln imports:"]),
    ("operator 0.outputs[0]", 0, ["writes tensor 0 ('x'), which already has a value"]),
])
def test_structural_errors_are_named(what, value, fragments):
    reject(patch(int8_conv_model(relu=True), what, value), *fragments)


def test_absurd_shapes_hit_the_limits():
    data = patch(patch(int8_conv_model(), "tensor 0.shape[1]", 1 << 30), "tensor 0.shape[2]", 1 << 30)
    reject(data, "tensor 0 ('x')", "max_tensor_elements exceeded", "set_limits")
    assert issubclass(TFLiteImportError, Exception) and LimitError


def test_flatbuffer_verifier_errors_name_the_path():
    data = int8_conv_model()
    reject(patch(data, "tensor 0.name", 0xFFFF), "not a valid TFLite flatbuffer", "model.subgraphs[0].tensors[0].name")
    reject(patch(data, "tensor 2.shape length", 1 << 29), "subgraphs[0].tensors[2].shape", "vector of")
    reject(data[:len(data) // 2], "not a valid TFLite flatbuffer")


def test_wrong_identifier_and_empty():
    good = int8_conv_model()
    reject(good[:4] + b"TFL2" + good[8:], "file identifier")
    reject(b"", "too short")


def test_several_subgraphs_and_unsupported_ops():
    b = Builder("sq")
    x = b.tensor("x", (1, 4), "float32")
    y = b.tensor("y", (4,), "float32")
    b.op("SKIP_GRAM", [x], [y], None)
    msg = reject(b.build([x], [y]), "unsupported TFLite op SKIP_GRAM at operator 0")
    assert "Kiln imports:" in msg and math.isfinite(1.0)


def test_constant_graph_outputs():
    """A constant output came out of the generated C as garbage (campaign: ad01 outputs[0] -> a
    weight tensor); graph inputs as outputs are fine."""
    b = Builder("c")
    x = b.tensor("x", (1, 4), "int8", scale=0.1, zero_point=0)
    c = b.tensor("c", (1, 4), "int8", data=np.arange(4).reshape(1, 4), scale=0.1, zero_point=0)
    y = b.tensor("y", (1, 4), "int8", scale=0.1, zero_point=0)
    b.op("ADD", [x, c], [y], "AddOptions", True)
    reject(b.build([x], [y, c]), "graph output tensor 1 ('c') is a constant")
    g = load_tflite(b.build([x], [y, x]))
    assert g.outputs[1] == g.inputs[0]
