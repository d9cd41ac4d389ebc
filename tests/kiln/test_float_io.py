"""Float I/O, int8 I/O and mixed I/O quantised models build and run on every emulated board, bit
for bit like the reference: `kiln quantize`'s default output (quantize/dequantize at the edges:
a float kernel that needs libm's floorf) used to fail to link, and a graph holding quantize
nodes failed to load ("unknown op 'quantize'")."""
import numpy as np
import pytest

from kiln import boards, hil, nn, trace
from kiln.quantize import ptq

pytestmark = pytest.mark.qemu


class Tiny(nn.Module):
    def __init__(self):
        self.conv = nn.Conv2d(1, 4, 3, padding="same", activation="relu")
        self.fc = nn.Linear(4 * 6 * 6, 5)

    def forward(self, x):
        return self.fc(nn.Flatten()(self.conv(x)))


def _graphs():
    from kiln.frontend import manual_seed
    manual_seed(3)
    g = trace(Tiny(), np.zeros((1, 6, 6, 1), np.float32))
    calib = np.random.default_rng(0).standard_normal((32, 6, 6, 1)).astype(np.float32)
    float_io = ptq(g, calib)
    int8_io = ptq(g, calib, int8_io=True)
    # mixed: float input, int8 output (drop the final dequantize)
    mixed = float_io.copy()
    last = next(n for n in mixed.nodes if n.name == mixed.outputs[0])
    assert last.op == "dequantize"
    mixed.outputs = [last.inputs[0]]
    mixed.nodes = [n for n in mixed.nodes if n is not last]
    return {"float_io": float_io, "int8_io": int8_io, "mixed": mixed}


GRAPHS = {}


@pytest.mark.parametrize("board", [b.name for b in boards.all_boards() if b.emulated])
@pytest.mark.parametrize("kind", ["float_io", "int8_io", "mixed"])
def test_quantised_io_variants_on_every_board(board, kind, tmp_path):
    if not GRAPHS:
        GRAPHS.update(_graphs())
    g = GRAPHS[kind]
    t = g.types[g.inputs[0]]
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(t.shape).astype(np.float32) if t.dtype == "float32"
          else rng.integers(-128, 128, t.shape).astype(np.int8) for _ in range(3)]
    image, pkg = hil.build_for_board(g, board, str(tmp_path))
    res = hil.run_on_board(image, pkg, xs)
    ref = hil.reference_outputs(g, xs)
    for got, want in zip(res.outputs, ref):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
