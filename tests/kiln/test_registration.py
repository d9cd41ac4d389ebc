"""Op registration is complete whatever a user imports: an int8 graph loaded and run in a fresh
interpreter (no `import kiln.quantize`) gives TFLite's int8 answer, and a float-I/O PTQ graph
(quantize/dequantize ops) loads."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from kiln.frontend import run, save
from kiln.frontend.tflite_import import load_tflite

SNIPPET = """
import json, sys
import numpy as np
{imp}
g = load(sys.argv[1])
x = np.load(sys.argv[2])
print(json.dumps(np.asarray(run(g, x)[0]).astype(np.int64).ravel().tolist()))
"""


@pytest.mark.parametrize("imp", ["from kiln import load, run", "from kiln.frontend import load, run",
                                 "from kiln.frontend.serialize import load\nfrom kiln.frontend.executor import run"])
def test_int8_graph_runs_in_a_fresh_interpreter(shared_models, tmp_path, imp):
    g = load_tflite(os.path.join(shared_models, "kws_ref_model.tflite"))
    save(g, tmp_path / "kws.json")
    z = np.load(os.path.join(shared_models, "kws_ref_model.golden.npz"))
    np.save(tmp_path / "x.npy", z["in_2"])
    out = subprocess.run([sys.executable, "-c", SNIPPET.format(imp=imp), str(tmp_path / "kws.json"),
                          str(tmp_path / "x.npy")], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == z["out_2"].astype(np.int64).ravel().tolist()
    assert np.array_equal(run(g, z["in_2"])[0], z["out_2"])


def test_float_io_ptq_graph_loads_in_a_fresh_interpreter(tmp_path):
    """kiln quantize's default output has quantize/dequantize nodes at its edges."""
    from kiln import trace
    from kiln.quantize import ptq
    from kiln.training.zoo import digits_cnn
    g = trace(digits_cnn(), np.zeros((1, 8, 8, 1), np.float32))
    q = ptq(g, np.random.default_rng(0).standard_normal((16, 8, 8, 1)).astype(np.float32))
    assert {"quantize", "dequantize"} <= {n.op for n in q.nodes}
    save(q, tmp_path / "q.json")
    code = ("import sys; from kiln.frontend import load; g = load(sys.argv[1]); "
            "print(sorted({n.op for n in g.nodes}))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "q.json")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "quantize" in out.stdout
