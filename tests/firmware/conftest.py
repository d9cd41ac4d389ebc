"""Fixtures for the firmware tests: built fixture images (cached per session), QEMU devices."""
import pytest

from tests.firmware import helpers


def pytest_generate_tests(metafunc):
    if "hil_board" in metafunc.fixturenames:
        metafunc.parametrize("hil_board", helpers.selected_boards(metafunc.config))


@pytest.fixture(scope="session")
def image_cache(tmp_path_factory):
    cache = {}

    def get(board: str, emulate: bool = True):
        key = (board, emulate)
        if key not in cache:
            helpers.need_toolchain()
            cache[key] = helpers.build_fixture(board, tmp_path_factory.mktemp(f"fw-{board}"),
                                               emulate=emulate)
        return cache[key]
    return get


@pytest.fixture
def hil_device(request, hil_board, image_cache):
    """A Device for --board: QEMU for emulated boards (and real boards' stand-ins when no port
    is given), the real board when --port or the lab map names one."""
    from kiln import boards
    from kiln.boards.labmap import load_lab_map
    from kiln.boards.target import open_device
    port = request.config.getoption("--port")
    lab_path = request.config.getoption("--lab-map")
    board = boards.load(hil_board)
    lab = load_lab_map(lab_path) if lab_path else None
    real = not board.emulated and (port or (lab and hil_board in lab.boards()))
    if not real:
        helpers.need_qemu()
    image = image_cache(hil_board, emulate=not real)
    with open_device(image, port=port if real else None, lab_map=lab if real else None,
                     timeout=2.0) as dev:
        yield dev
