"""The verify target of a board (kiln verify MODEL --golden G --target mps2-an386): compile the
model for the board's core, build the firmware (real boards with their real memory sizes, run in
QEMU on the machine with the same core unless a port is given), run every golden input on it.
kiln/targets.py makes one per board from :func:`board_runner`."""
from __future__ import annotations

import tempfile

from kiln import hil


def board_runner(board_name):
    """``runner(model, inputs, options)`` of the board's verify target."""
    def runner(model, inputs, options):
        out = options.get("out") or tempfile.mkdtemp(prefix=f"kiln_{board_name}_")
        image, pkg_dir = hil.build_for_board(model, board_name, out, port=options.get("port"),
                                             lab_map=options.get("lab_map"), semantics=options.get("semantics"))
        lease = options.get("lease")        # a labgrid place (kiln.boards.farm.Lease): it flashes
        if lease is not None:
            options["flashed_by"] = lease.flash(image)
        res = hil.run_on_board(image, pkg_dir, inputs, port=options.get("port"), lab_map=options.get("lab_map"),
                               device_kw={"flash": False} if lease is not None else None)
        options["board_run"] = res.to_dict()
        return res.outputs
    return runner
