"""Fixtures for the board/harness tests. Options (--board, --port, --lab-map) live in
tests/conftest.py; the firmware fixtures are shared through tests/firmware/helpers.py."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "firmware"))
import helpers  # noqa: E402  (tests/firmware/helpers.py)


@pytest.fixture(scope="session")
def an386_image(tmp_path_factory):
    helpers.need_toolchain()
    return helpers.build_fixture("mps2-an386", tmp_path_factory.mktemp("fw-an386"))
