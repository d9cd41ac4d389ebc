"""Fuzz the frame parser and the whole command loop on the host under ASan/UBSan."""
import shutil

import pytest

from kiln.firmware import build_fuzzer, run_fuzzer


def test_fuzz_parser_and_command_loop(tmp_path):
    if not shutil.which("gcc"):
        pytest.skip("no host gcc")
    exe = build_fuzzer(tmp_path)
    stats = run_fuzzer(exe, iterations=100_000, seed=20240611, timeout=180)
    assert stats["iterations"] == 100_000
    assert stats["exact"] == 25_000
    assert stats["transactions"] == 25_000        # whole transactions, replies checked
    assert stats["reply_frames"] > 100_000          # the firmware answered a lot of them
