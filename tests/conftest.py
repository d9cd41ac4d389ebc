"""Top-level pytest configuration: options shared by every test folder.

--board B[,B...]   boards for the hardware-in-the-loop tests (default: mps2-an386,mps3-an547;
                   'all-emulated' for every emulated board). A real board runs the same tests when
                   given with --port (or listed in the lab map).
--port URL         serial port / pyserial URL of a real board (e.g. /dev/ttyACM0, rfc2217://host:port)
--lab-map FILE     TOML lab map naming which real board is on which port
"""
import os
import shutil

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("KILN_SHARED", os.path.join(os.path.dirname(ROOT), "shared"))


def pytest_addoption(parser):
    parser.addoption("--board", default=os.environ.get("KILN_TEST_BOARDS", "mps2-an386,mps3-an547"),
                     help="comma-separated boards for hardware-in-the-loop tests")
    parser.addoption("--port", default=None, help="serial port/URL of a real board")
    parser.addoption("--lab-map", default=os.environ.get("KILN_LAB_MAP"), help="lab map TOML")


def pytest_collection_modifyitems(config, items):
    have_gpu = shutil.which("nvidia-smi") is not None
    skip_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU (none found: nvidia-smi missing)")
    for item in items:
        if "gpu" in item.keywords and not have_gpu:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def shared_models():
    """Path of ../shared/models (real MLPerf Tiny int8 models with golden pairs)."""
    path = os.path.join(SHARED, "models")
    if not os.path.isdir(path):
        pytest.skip(f"shared models not found at {path} (set KILN_SHARED)")
    return path
