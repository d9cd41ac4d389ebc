"""The int8 conv kernels of kiln_intrinsics.h (fused groups-1 conv: kiln_conv_s8 with the widened
patch pair, built directly when C_in % 4 == 0; depthwise: kiln_dwconv_s8) bit-exact with the int8
reference over a table of shapes: input channels 1..12 (the direct and the int8-then-widen patch
paths), reductions that are not a multiple of 4 or 8, the four-group unrolled loop and its tail,
strides, padding, clipped windows on every side, odd pixel counts, and channels whose weights are
all zero with the huge biases and scales of pruned models (compile-time constant outputs). The
packages run on the host (the portable C of the kernels); the DSP versions run the same table on
an emulated Cortex-M4 in test_conv_kernels_on_board."""
import numpy as np
import pytest

from kiln.backends import compile as compile_pkg
from kiln.backends import schedules
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
]


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    g = _graph(CONV_CASES + DW_CASES)
    pk = {o: compile_pkg(g, target="host", out_dir=tmp_path_factory.mktemp(o), plot=False, measure_size=False,
                         optimize=o) for o in ("size", "speed")}
    return g, pk


def test_the_table_takes_the_fused_kernels(packages):
    g, pk = packages
    src = open(f"{pk['size'].path}/kernels.c").read()
    bodies = {b.split("(")[0].split("_", 1)[1]: b for b in src.split("static void k")[1:]}
    for case in CONV_CASES:
        assert "kiln_conv_s8(" in bodies[case[0]], case[0]
    for case in DW_CASES:
        assert "kiln_dwconv_s8(" in bodies[case[0]], case[0]


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
def test_conv_kernels_on_board(board, tmp_path):
    """The same table on an emulated Cortex-M4 (the DSP kernels: SMLAD, SXTB16, SMMULR) and
    Cortex-M3 (their portable C), bit-exact with the int8 reference on 2 inputs."""
    from kiln.commands.verify import verify
    from kiln.frontend import save

    g = _graph(CONV_CASES + DW_CASES)
    path = str(tmp_path / "conv_kernels.json")
    save(g, path)
    gold = {}
    for k in range(2):
        x = RNG.integers(-128, 128, (1, 9, 7, 12)).astype(np.int8)
        gold[f"in_{k}_0"] = x
        for j, y in enumerate(run(g, x)):
            gold[f"out_{k}_{j}"] = y
    np.savez(tmp_path / "gold.npz", **gold)
    rep = verify(path, str(tmp_path / "gold.npz"), board, options={"out": str(tmp_path / "board")})
    assert rep["ok"] and rep["matched"] == 2, rep["results"]
