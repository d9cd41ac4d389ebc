"""Models with several inputs and outputs: sample files (golden pairs in_K_J/out_K_J and data
arrays), `kiln golden`, and `kiln verify` on the reference and the host C package."""
import numpy as np
import pytest

from kiln.cli import main
from kiln.frontend import Graph, QParams, TensorType, save
from kiln.samples import SampleError, golden_arrays, golden_pairs, load_samples, random_inputs


def two_in_two_out():
    """TFLite Micro's memory_footprint example (an int8 ADD of two 128x128 inputs) plus a second
    output (a MUL of the sum with the second input) and a float third input feeding a float output."""
    g = Graph("two_in")
    qa, qb, qs = QParams((0.05,), (3,)), QParams((0.04,), (-7,)), QParams((0.09,), (-1,))
    g.add_input("a", TensorType((1, 128, 128), "int8", qa))
    g.add_input("b", TensorType((1, 128, 128), "int8", qb))
    g.add_input("f", TensorType((1, 4), "float32"))
    g.add_node("add", ["a", "b"], name="sum", out_type=TensorType((1, 128, 128), "int8", qs))
    g.add_node("mul", ["sum", "b"], name="prod", out_type=TensorType((1, 128, 128), "int8", QParams((0.2,), (5,))))
    g.add_node("tanh", ["f"], name="ft")
    g.outputs = ["sum", "prod", "ft"]
    return g


def test_golden_pairs_round_trip():
    pairs = [((np.zeros(2), np.ones(3)), (np.full(1, 7),)), ((np.ones(2), np.zeros(3)), (np.full(1, 8),))]
    arrs = golden_arrays(pairs)
    assert sorted(arrs) == ["in_0_0", "in_0_1", "in_1_0", "in_1_1", "out_0_0", "out_1_0"]
    back = golden_pairs(arrs)
    assert len(back) == 2 and all(np.array_equal(a, b) for (i, _), (j, _) in zip(back, pairs) for a, b in zip(i, j))
    single = golden_arrays([((np.zeros(2),), (np.ones(2),))])
    assert sorted(single) == ["in_0", "out_0"]


def test_golden_pairs_errors():
    with pytest.raises(SampleError, match="no out_1"):
        golden_pairs({"in_0": 1, "out_0": 1, "in_1": 2})
    with pytest.raises(SampleError, match="numbered"):
        golden_pairs({"in_0_0": 1, "in_0_2": 1, "out_0": 1})
    with pytest.raises(SampleError, match="mixes"):
        golden_pairs({"in_0_0": 1, "in_0": 1, "out_0": 1})


def test_data_arrays_by_name_and_position(tmp_path):
    g = two_in_two_out()
    rng = np.random.default_rng(0)
    a, b = rng.integers(-128, 128, (5, 1, 128, 128)), rng.integers(-128, 128, (5, 128, 128))
    f = rng.standard_normal((5, 4)).astype(np.float32)
    np.savez(tmp_path / "named.npz", a=a, b=b, f=f)
    np.savez(tmp_path / "pos.npz", x_0=a, x_1=b, x_2=f)
    for name in ("named", "pos"):
        s = load_samples(tmp_path / f"{name}.npz", g)
        assert len(s) == 5 and s.kind == "inputs" and len(s.inputs[0]) == 3
        assert s.inputs[3][1].shape == (1, 128, 128) and s.inputs[3][1].dtype == np.int8
    np.savez(tmp_path / "bad.npz", a=a, f=f)
    with pytest.raises(SampleError, match="3 inputs"):
        load_samples(tmp_path / "bad.npz", g)


def test_float_data_is_quantised_for_int8_inputs(tmp_path):
    g = Graph("q")
    g.add_input("x", TensorType((1, 3), "int8", QParams((0.5,), (10,))))
    g.add_node("relu", ["x"], name="y", out_type=TensorType((1, 3), "int8", QParams((0.5,), (10,))))
    g.outputs = ["y"]
    np.savez(tmp_path / "d.npz", x=np.array([[1.0, -2.25, 100.0]], np.float32), y=np.array([1]))
    s = load_samples(tmp_path / "d.npz", g)
    assert s.inputs[0][0].tolist() == [[12, 5, 127]]   # round(v / 0.5) + 10, clamped
    assert s.kind == "labels" and s.targets == [1]


@pytest.mark.parametrize("target", ["reference", "host"])
def test_golden_and_verify_on_a_multi_io_model(tmp_path, target, capsys):
    g = two_in_two_out()
    save(g, tmp_path / "m.json")
    assert main(["golden", str(tmp_path / "m.json"), "-o", str(tmp_path / "g.npz"), "--inputs", "3"]) == 0
    z = np.load(tmp_path / "g.npz")
    assert sorted(z.files)[:3] == ["in_0_0", "in_0_1", "in_0_2"] and "out_2_2" in z.files
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "m.json"), "--golden", str(tmp_path / "g.npz"), "--target", target,
                 "--json"]) == 0
    # a wrong element in the second output of pair 1 fails the check, and says where
    d = dict(z)
    d["out_1_1"] = d["out_1_1"].copy()
    d["out_1_1"][0, 5, 7] += 1
    np.savez(tmp_path / "bad.npz", **d)
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "m.json"), "--golden", str(tmp_path / "bad.npz"), "--target", target]) == 1
    out = capsys.readouterr().out
    assert "pair 1" in out and "[0, 5, 7]" in out


def test_random_inputs_cover_every_input():
    g = two_in_two_out()
    xs = random_inputs(g, 2, seed=1)
    assert [x.dtype for x in xs[0]] == [np.int8, np.int8, np.float32]
    assert not np.array_equal(xs[0][0], xs[1][0])
