"""The int8 conv kernels of kiln_intrinsics.h (fused groups-1 conv: kiln_conv_s8 with the widened
patch pair, built directly when C_in % 4 == 0, and kiln_conv8_s8 with the int8 pair (small layers
under --optimize size); depthwise: kiln_dw3_s8 for 3x3 windows, kiln_dwconv_s8) bit-exact with the int8
reference over a table of shapes: input channels 1..12 (the direct and the int8-then-widen patch
paths), reductions that are not a multiple of 4 or 8, the four-group unrolled loop and its tail,
strides, padding, clipped windows on every side, odd pixel counts, and channels whose weights are
all zero with the huge biases and scales of pruned models (compile-time constant outputs). The
packages run on the host (the portable C of the kernels); the DSP versions run the same table on
an emulated Cortex-M4 in test_conv_kernels_on_board."""
import numpy as np
import pytest

from kiln.backends import compile as compile_pkg
from kiln.backends import ops_dw, ops_nn, schedules
from kiln.frontend import Graph, QParams, TensorType, run
from kiln.frontend.ops.nn import conv_geometry

RNG = np.random.default_rng(15)


def _q(scale, zp):
    return QParams((scale,), (zp,))


def _graph(cases, shape=(1, 9, 7, 12), zx=-128):
    """One input, one conv per case (name, O, KH, KW, attrs, dead channels), every conv an output."""
    g = Graph("conv_kernels")
    g.add_input("x", TensorType(shape, "int8", _q(0.04, zx)))
    for name, O, KH, KW, attrs, dead in cases:
        src = "x"
        C = shape[3]
        if attrs.get("cin", C) != C:        # cin channels from a 1x1 conv of the input
            src = name + "_in"
            cin = attrs["cin"]
            g.add_const(src + "_w", RNG.integers(-127, 128, (cin, 1, 1, C)).astype(np.int8),
                        QParams((0.01,) * cin, (0,) * cin, 0))
            g.add_node("conv2d", ["x", src + "_w"], {"groups": 1, "activation": "none"}, name=src,
                       out_type=TensorType(shape[:3] + (cin,), "int8", _q(0.3, zx)))
        a = {"groups": 1, **{k: v for k, v in attrs.items() if k != "cin"}}
        t = g.types[src]
        groups = a.get("groups", 1)
        I = t.shape[3] // groups
        w = RNG.integers(-127, 128, (O, KH, KW, I)).astype(np.int8)
        ws = RNG.uniform(0.002, 0.02, O)
        b = RNG.integers(-3000, 3000, O).astype(np.int64)
        for ch in dead:                  # a pruned channel: zero weights, a bias of +-2^30, tiny or huge scales
            w[ch] = 0
            b[ch] = (1 << 30) * (1 if ch % 2 else -1)
            ws[ch] = 1e-12 if ch % 3 else 50.0
        g.add_const(name + "_w", w, QParams(tuple(float(s) for s in ws), (0,) * O, 0))
        g.add_const(name + "_b", b.astype(np.int32))
        G = conv_geometry(t.shape, (O, KH, KW, I), {"stride": [1, 1], "padding": "valid", "dilation": [1, 1], **a})
        g.add_node("conv2d", [src, name + "_w", name + "_b"], a, name=name,
                   out_type=TensorType((1, G["oh"], G["ow"], O), "int8",
                                       _q(float(RNG.uniform(0.05, 0.2)), int(RNG.integers(-128, 20)))))
        g.outputs.append(name)
    return g.validate()


CONV_CASES = [
    # name, O, KH, KW, attrs (cin: input channels), dead channels
    ("pw_c12", 6, 1, 1, {"activation": "relu"}, ()),                                  # K = 12: 3 tail groups
    ("pw_c8_o16", 16, 1, 1, {"cin": 8, "activation": "none"}, (3, 4)),                 # K = 8
    ("c3_c12", 8, 3, 3, {"padding": "same", "activation": "relu6"}, (1,)),             # K = 108: unrolled + tail
    ("c3_c4_s2", 4, 3, 3, {"cin": 4, "padding": "same", "stride": [2, 2], "activation": "none"}, ()),
    ("c3_c3", 16, 3, 3, {"cin": 3, "padding": "same", "activation": "relu"}, (0, 5)),  # ResNet/VWW first layer
    ("c_c1_tall", 10, 5, 4, {"cin": 1, "padding": "same", "stride": [2, 2], "activation": "relu"}, ()),  # KWS first
    ("c_c5_valid", 2, 2, 3, {"cin": 5, "padding": "valid", "activation": "none"}, ()),
    ("c_c12_odd", 4, 3, 2, {"padding": "valid", "stride": [1, 2], "activation": "none"}, ()),   # 7 x 3 pixels: odd
    ("pw_s2", 8, 1, 1, {"stride": [2, 2], "activation": "relu"}, (2,)),
]

DW_CASES = [
    ("dw3", 12, 3, 3, {"groups": 12, "padding": "same", "activation": "relu"}, ()),
    ("dw3_s2", 12, 3, 3, {"groups": 12, "padding": "same", "stride": [2, 2], "activation": "relu6"}, ()),
    ("dw_valid", 12, 3, 2, {"groups": 12, "padding": "valid", "stride": [1, 2], "activation": "none"}, ()),
    ("dw5_dil", 8, 5, 5, {"cin": 8, "groups": 8, "padding": "same", "dilation": [2, 2], "activation": "none"}, ()),
    ("dw3_c4", 4, 3, 3, {"cin": 4, "groups": 4, "padding": [2, 0, 0, 2], "activation": "relu"}, ()),
    # kiln_dw3_s8 (the 3x3 row-ring kernel): row/column strides, odd output widths (a phantom pixel
    # in the last pair), asymmetric and wide padding (whole padding rows and columns in the ring)
    ("dw3_s12", 12, 3, 3, {"groups": 12, "padding": "same", "stride": [1, 2], "activation": "relu6"}, ()),
    ("dw3_s21_valid", 12, 3, 3, {"groups": 12, "padding": "valid", "stride": [2, 1], "activation": "none"}, ()),
    ("dw3_s31", 8, 3, 3, {"cin": 8, "groups": 8, "padding": [1, 2, 2, 1], "stride": [3, 1], "activation": "none"},
     ()),
    ("dw3_pad_wide", 4, 3, 3, {"cin": 4, "groups": 4, "padding": [0, 2, 2, 0], "stride": [1, 2],
                               "activation": "relu"}, ()),
    ("dw3_c16", 16, 3, 3, {"cin": 16, "groups": 16, "padding": "same", "activation": "none"}, ()),
    # the per-pixel kernel: column stride 3, dilation; channels not a multiple of 4: TVM's loops
    ("dw3_s3", 8, 3, 3, {"cin": 8, "groups": 8, "padding": "same", "stride": [3, 3], "activation": "none"}, ()),
    ("dw3_dil", 8, 3, 3, {"cin": 8, "groups": 8, "padding": "same", "dilation": [2, 1], "activation": "relu"}, ()),
    ("dw3_c5", 5, 3, 3, {"cin": 5, "groups": 5, "padding": "same", "activation": "none"}, ()),
]
# the kernel each depthwise case must take (None: neither C kernel; C % 4 != 0)
DW_KERNEL = {"dw3": "kiln_dw3_s8", "dw3_s2": "kiln_dw3_s8", "dw_valid": "kiln_dwconv_s8",
             "dw5_dil": "kiln_dwconv_s8", "dw3_c4": "kiln_dw3_s8", "dw3_s12": "kiln_dw3_s8",
             "dw3_s21_valid": "kiln_dw3_s8", "dw3_s31": "kiln_dw3_s8", "dw3_pad_wide": "kiln_dw3_s8",
             "dw3_c16": "kiln_dw3_s8", "dw3_s3": "kiln_dwconv_s8", "dw3_dil": "kiln_dwconv_s8", "dw3_c5": None}


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ops_dw, "DW3_MIN_OW", {1: 1, 2: 1})      # the table's outputs are at most 7 wide
        return _packages(tmp_path_factory)


def _packages(tmp_path_factory):
    g = _graph(CONV_CASES + DW_CASES)
    pk = {o: compile_pkg(g, target="host", out_dir=tmp_path_factory.mktemp(o), plot=False, measure_size=False,
                         optimize=o) for o in ("size", "speed")}
    return g, pk


def test_the_table_takes_the_fused_kernels(packages):
    g, pk = packages
    src = open(f"{pk['size'].path}/kernels.c").read()
    bodies = {b.split("(")[0].split("_", 1)[1]: b for b in src.split("static void k")[1:]}
    speed = open(f"{pk['speed'].path}/kernels.c").read()
    fast = {b.split("(")[0].split("_", 1)[1]: b for b in speed.split("static void k")[1:]}
    for case in CONV_CASES:     # small layers: the int8 pair under size, the widened pair under speed
        assert "kiln_conv8_s8(" in bodies[case[0]], case[0]
        assert "kiln_conv_s8(" in fast[case[0]], case[0]
    for case in DW_CASES:
        kernel = DW_KERNEL[case[0]]
        if kernel is None:
            assert "kiln_dw3_s8(" not in bodies[case[0]] and "kiln_dwconv_s8(" not in bodies[case[0]], case[0]
        else:
            assert kernel + "(" in bodies[case[0]], case[0]


@pytest.mark.parametrize("optimize", ["size", "speed"])
def test_conv_kernels_bit_exact_on_host(packages, optimize):
    g, pk = packages
    for _trial in range(4):
        x = RNG.integers(-128, 128, (1, 9, 7, 12)).astype(np.int8)
        for name, want, got in zip(g.outputs, run(g, x), pk[optimize].run(x)):
            np.testing.assert_array_equal(got, want, err_msg=f"{name} ({optimize})")


def test_extreme_inputs_bit_exact(packages):
    """All -128 / all 127: the accumulator bounds the requantisation shortcut was checked against."""
    g, pk = packages
    for v in (-128, 127):
        x = np.full((1, 9, 7, 12), v, np.int8)
        for name, want, got in zip(g.outputs, run(g, x), pk["size"].run(x)):
            np.testing.assert_array_equal(got, want, err_msg=f"{name} (x = {v})")


def test_constant_channel_requantisation_table():
    """A constant channel c gets multiplier 0, e = 1, hz = 2c + 1: the kernel's
    (SMMULR(2 acc, 0) + hz + sign) >> e gives c for every c in [-128, 127]."""
    const = [None, -128, 0, 127, 5, None]
    bias = np.array([10, 1 << 30, -(1 << 30), 7, 0, -3])
    mult = np.full(6, 1 << 30)
    shift = np.array([-8, -31, 0, 3, -2, -9])
    shift[[0, 5]] = -8
    tab = schedules.conv_requant_table(bias, mult, shift, -128, const)
    words = tab[:18].reshape(3, 6)
    e = tab[18:].view(np.uint8)[:6]
    for ch, c in enumerate(const):
        blk, j = divmod(ch, 2)
        if c is None:
            assert words[blk, 2 + j] == 1 << 30 and e[ch] == 8
            continue
        assert words[blk, j] == 0 and words[blk, 2 + j] == 0 and e[ch] == 1
        assert (int(words[blk, 4 + j]) + 0) >> 1 == c


@pytest.mark.slow
@pytest.mark.qemu
@pytest.mark.parametrize("board", ["mps2-an386", "mps2-an385"])
def test_conv_kernels_on_board(board, tmp_path, monkeypatch):
    """The same table on an emulated Cortex-M4 (the DSP kernels: SMLAD, SXTB16, SMMULR) and
    Cortex-M3 (their portable C), bit-exact with the int8 reference on 2 inputs."""
    from kiln.commands.verify import verify
    from kiln.frontend import save

    monkeypatch.setattr(ops_dw, "DW3_MIN_OW", {1: 1, 2: 1})
    # the firmware takes up to 16 outputs; the conv table twice: kiln_conv8_s8 (the small layers
    # of --optimize size) and kiln_conv_s8 (NARROW_MAX_MACS 0)
    for part, cases, narrow in (("conv8", CONV_CASES, None), ("conv", CONV_CASES, 0), ("dw", DW_CASES, None)):
        if narrow is not None:
            monkeypatch.setattr(ops_nn, "NARROW_MAX_MACS", narrow)
        g = _graph(cases)
        path = str(tmp_path / f"{part}_kernels.json")
        save(g, path)
        gold = {}
        for k in range(2):
            x = RNG.integers(-128, 128, (1, 9, 7, 12)).astype(np.int8)
            gold[f"in_{k}_0"] = x
            for j, y in enumerate(run(g, x)):
                gold[f"out_{k}_{j}"] = y
        np.savez(tmp_path / f"{part}_gold.npz", **gold)
        rep = verify(path, str(tmp_path / f"{part}_gold.npz"), board, options={"out": str(tmp_path / f"{part}_board")})
        assert rep["ok"] and rep["matched"] == 2, (part, rep["results"])


def test_dw3_picks_wide_3x3_layers():
    """kiln_dw3_s8 where it pays (3x3, dilation 1, C % 4 == 0, outputs at least DW3_MIN_OW wide),
    the per-pixel kernel elsewhere."""
    def geo(ow=48, sw=1, C=8, k=3, d=1):
        return {"KH": k, "KW": k, "dh": d, "dw": d, "sw": sw, "ow": ow, "C": C}
    assert ops_dw.dw3_applies(geo()) and ops_dw.dw3_applies(geo(ow=24, sw=2, C=16))
    assert not ops_dw.dw3_applies(geo(ow=6))            # narrow: the per-row work does not pay
    assert not ops_dw.dw3_applies(geo(ow=12, sw=2))
    assert not ops_dw.dw3_applies(geo(sw=3)) and not ops_dw.dw3_applies(geo(d=2))
    assert not ops_dw.dw3_applies(geo(k=5)) and not ops_dw.dw3_applies(geo(C=6))
    assert not ops_dw.dw3_applies(geo(ow=400, C=64))    # scratch over DW3_MAX_SCRATCH


def test_dw3_table_layout():
    """Per channel {W01, W12} per kernel row (doubled int16 pairs, low half first), 2 * bias,
    multiplier, half + (zy << e), e."""
    w = np.arange(-9, 9, dtype=np.int8).reshape(2, 9)
    tab = ops_dw.dw3_table(w, np.array([5, -7]), np.array([1 << 30, 3 << 28]), np.array([-3, -9]), -128)
    rec = tab.reshape(2, 10).view(np.uint32)
    for ch in range(2):
        for k in range(3):
            w0, w1, w2 = (2 * w[ch, 3 * k:3 * k + 3].astype(np.int64)).tolist()
            assert rec[ch, 2 * k] == (w0 & 0xFFFF) | ((w1 & 0xFFFF) << 16)
            assert rec[ch, 2 * k + 1] == (w1 & 0xFFFF) | ((w2 & 0xFFFF) << 16)
    r = tab.reshape(2, 10)
    assert r[0, 6:].tolist() == [10, 1 << 30, 4 - 128 * 8, 3]
    assert r[1, 6:].tolist() == [-14, 3 << 28, 256 - 128 * 512, 9]


def test_size_mode_packs_int16_weights_of_large_outputs():
    """--optimize size: int8 weights, except layers of at most W16_MAX_BYTES whose output has
    W16_SIZE_MIN_PIXELS pixels (ResNet-8's 32x32 convs); speed: int16 up to W16_MAX_BYTES."""
    from kiln.backends.ops_nn import W16_SIZE_MIN_PIXELS, _fused_weight_bits

    big = {"N": 1, "oh": 32, "ow": W16_SIZE_MIN_PIXELS // 32}
    small = {"N": 1, "oh": 25, "ow": 5}
    assert _fused_weight_bits(16, 144, big, "size") == 16
    assert _fused_weight_bits(64, 64, small, "size") == 8
    assert _fused_weight_bits(64, 64, small, "speed") == 16
    assert _fused_weight_bits(64, 128, big, "size") == 8     # over W16_MAX_BYTES


def test_narrow_patch_only_for_small_layers_under_size():
    from kiln.backends.ops_nn import NARROW_MAX_MACS, _narrow_patch

    demo = {"N": 1, "oh": 8, "ow": 8, "O": 16}            # the digits CNN's second conv: 73,728 MACs
    assert _narrow_patch(demo, 72, "size") and not _narrow_patch(demo, 72, "speed")
    assert not _narrow_patch({"N": 1, "oh": 16, "ow": 16, "O": 32}, 16, "size")   # 131,072 MACs
    assert 73_728 < NARROW_MAX_MACS <= 131_072
