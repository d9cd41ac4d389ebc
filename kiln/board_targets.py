"""One verify target per board (kiln verify MODEL --golden G --target mps2-an386): compile the
model for the board's core, build the firmware (real boards with their real memory sizes, run in
QEMU on the machine with the same core unless a port is given), run every golden input on it."""
from __future__ import annotations

import tempfile

from kiln.targets import Target, register_target


def _runner(board_name):
    def runner(model, inputs, options):
        from kiln import hil
        out = options.get("out") or tempfile.mkdtemp(prefix=f"kiln_{board_name}_")
        image, pkg_dir = hil.build_for_board(model, board_name, out, port=options.get("port"),
                                             lab_map=options.get("lab_map"))
        res = hil.run_on_board(image, pkg_dir, inputs, port=options.get("port"), lab_map=options.get("lab_map"))
        options["board_run"] = res.to_dict()
        return res.outputs
    return runner


def _register():
    try:
        from kiln import boards
    except ImportError:
        return
    for name in boards.board_names():
        register_target(Target(name, _runner(name), exact=True, multi_io=True,
                               description=f"firmware on board {name}"))


_register()
