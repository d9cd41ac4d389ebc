"""The C package's input/output API for models with several inputs and outputs: the tables
kiln_inputs/kiln_outputs (name, size, packed offset, dtype, shape, quantisation), lookup by name
and by index, used from a plain C program compiled against the package on the host."""
import subprocess

import numpy as np

from kiln.backends import compile as compile_pkg
from kiln.frontend import run

from ..kiln.test_multi_io import two_in_two_out

HARNESS = r"""
#include <stdio.h>
#include <string.h>
#include "model.h"

static uint8_t arena[KILN_ARENA_SIZE] __attribute__((aligned(16)));
static uint8_t in[KILN_INPUT_BYTES], out[KILN_OUTPUT_BYTES];

int main(int argc, char **argv)
{
    /* argv: one raw file per input, given by NAME=path in any order */
    for (int a = 1; a < argc; ++a) {
        char *eq = strchr(argv[a], '=');
        *eq = 0;
        int i = kiln_input_index(argv[a]);
        if (i < 0) { fprintf(stderr, "no input %s\n", argv[a]); return 3; }
        FILE *f = fopen(eq + 1, "rb");
        if (fread(kiln_input_ptr(in, i), 1, kiln_inputs[i].bytes, f) != kiln_inputs[i].bytes) return 4;
        fclose(f);
    }
    if (kiln_input_index("no-such") != -1 || kiln_input_ptr(in, KILN_NUM_INPUTS) != NULL) return 5;
    if (kiln_model_run(arena, in, out) != 0) return 6;
    /* outputs by name, in reverse order, with their descriptions */
    for (int j = KILN_NUM_OUTPUTS - 1; j >= 0; --j) {
        const kiln_tensor_info_t *t = &kiln_outputs[kiln_output_index(kiln_outputs[j].name)];
        printf("%s dtype=%u rank=%u scale=%g zp=%d bytes=%u\n", t->name, t->dtype, t->rank, (double)t->scale,
               (int)t->zero_point, (unsigned)t->bytes);
        char path[256];
        snprintf(path, sizeof path, "out_%d.bin", j);
        FILE *f = fopen(path, "wb");
        fwrite(kiln_output_ptr(out, j), 1, t->bytes, f);
        fclose(f);
    }
    return 0;
}
"""


def test_inputs_and_outputs_by_name_from_c(tmp_path):
    g = two_in_two_out()
    pkg = compile_pkg(g, target="host", out_dir=tmp_path / "pkg", plot=False, measure_size=False)
    rng = np.random.default_rng(4)
    xs = [rng.integers(-128, 128, (1, 128, 128)).astype(np.int8), rng.integers(-128, 128, (1, 128, 128)).astype(np.int8),
          rng.standard_normal((1, 4)).astype(np.float32)]
    args = []
    for name, x in reversed(list(zip(g.inputs, xs))):     # by name, not by position
        p = tmp_path / f"{name}.bin"
        x.tofile(p)
        args.append(f"{name}={p}")
    (tmp_path / "main.c").write_text(HARNESS)
    srcs = [str(tmp_path / "main.c"), str(tmp_path / "pkg" / "model.c"), str(tmp_path / "pkg" / "kernels.c")]
    subprocess.run(["gcc", "-O1", "-std=c99", "-Wall", "-Wextra", "-Werror", "-I", str(tmp_path / "pkg"), *srcs,
                    "-o", str(tmp_path / "m"), "-lm"], check=True)
    r = subprocess.run([str(tmp_path / "m"), *args], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("ft dtype=1 rank=2") and lines[2].startswith("sum dtype=2 rank=3 scale=0.09 zp=-1")
    want = run(g, *xs)
    for j, (w, name) in enumerate(zip(want, g.outputs)):
        got = np.fromfile(tmp_path / f"out_{j}.bin", dtype=w.dtype).reshape(w.shape)
        if w.dtype.kind == "f":
            np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(got, w, err_msg=name)
    assert pkg.arena_bytes > 0
