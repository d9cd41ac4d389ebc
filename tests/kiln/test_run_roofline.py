"""`kiln run`'s per-layer roofline: MACs per instruction against the core's ceiling."""
import pytest

from kiln.commands.run import roofline
from kiln.common.cores import CORES
from kiln.report import plot_roofline

PROFILE = [{"name": "conv", "ops": "conv2d", "macs": 1000, "instructions": 2000, "ticks": 0},
           {"name": "softmax", "ops": "softmax", "macs": 0, "instructions": 500, "ticks": 0},
           {"name": "dense", "ops": "dense", "macs": 64, "instructions": None, "ticks": 0}]


@pytest.mark.parametrize("core, limit", [("cortex-m0plus", 1), ("cortex-m3", 1), ("cortex-m4", 2),
                                         ("cortex-m7", 2), ("cortex-m33", 2), ("cortex-m55", 16)])
def test_ceiling_per_core(core, limit):
    rows = roofline(PROFILE, CORES[core])
    conv, softmax, dense = rows
    assert conv["macs_per_instruction"] == 0.5 and conv["limit_macs_per_instruction"] == limit
    assert conv["of_limit"] == round(0.5 / limit, 4)
    # no MACs: no rate and no ceiling; no instruction count (a real board): no rate
    assert softmax["macs_per_instruction"] is None and softmax["limit_macs_per_instruction"] is None
    assert dense["macs_per_instruction"] is None and dense["of_limit"] is None
    assert all(r["name"] == p["name"] and r["instructions"] == p["instructions"] for r, p in zip(rows, PROFILE))


def test_plot_is_written(tmp_path):
    path = tmp_path / "roof.png"
    plot_roofline(roofline(PROFILE, CORES["cortex-m4"]), str(path), "t")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
