"""Fixtures for the board/harness tests. Options (--board, --port, --lab-map) live in
tests/conftest.py; the firmware fixtures are shared through tests/firmware/helpers.py."""
import pytest

from tests.firmware import helpers


@pytest.fixture(scope="session")
def an386_image(tmp_path_factory):
    helpers.need_toolchain()
    return helpers.build_fixture("mps2-an386", tmp_path_factory.mktemp("fw-an386"))
