"""The hand-written tiny_dense package: checked-in files are what the generator writes, and the
C computes the NumPy reference bit-exactly when compiled for the host."""
import json
import shutil
import subprocess

import numpy as np
import pytest

from tests.firmware import helpers
from tests.firmware.helpers import make_tiny_dense as m


def test_checked_in_files_match_generator():
    for name, text in m.files().items():
        assert (helpers.TINY_DENSE / name).read_text() == text, f"regenerate: python {m.__file__}"


def test_manifest_agrees_with_model_h():
    man = json.loads((helpers.TINY_DENSE / "manifest.json").read_text())
    h = (helpers.TINY_DENSE / "model.h").read_text()
    assert f"#define KILN_ARENA_SIZE    {man['arena_bytes']}" in h
    assert f"#define KILN_INPUT_BYTES   {man['inputs'][0]['bytes']}" in h
    assert man["arena_bytes"] % 16 == 0


HOST_MAIN = r"""
#include <stdio.h>
#include <stdint.h>
#include "model.h"
static uint8_t arena[KILN_ARENA_SIZE] __attribute__((aligned(16)));
int main(void) {
    int8_t x[KILN_INPUT_BYTES], y[KILN_OUTPUT_BYTES];
    if (fread(x, 1, sizeof x, stdin) != sizeof x) return 2;
    int rc = kiln_model_run(arena, x, y);
    fwrite(y, 1, sizeof y, stdout);
    return rc;
}
"""


def test_host_build_matches_numpy(tmp_path):
    if not shutil.which("gcc"):
        pytest.skip("no host gcc")
    (tmp_path / "main.c").write_text(HOST_MAIN)
    exe = tmp_path / "model"
    subprocess.run(["gcc", "-O2", "-fsanitize=address,undefined", f"-I{helpers.TINY_DENSE}",
                    str(tmp_path / "main.c"), str(helpers.TINY_DENSE / "model.c"),
                    str(helpers.TINY_DENSE / "kernels.c"), "-o", str(exe)], check=True)
    for seed in range(5):
        x = m.sample_input(seed)
        out = subprocess.run([str(exe)], input=x.tobytes(), capture_output=True, check=True).stdout
        np.testing.assert_array_equal(np.frombuffer(out, np.int8), m.reference(x))
