"""kiln build --board B MODEL: compile (unless MODEL is a package folder) and build firmware."""
from __future__ import annotations

import os

from kiln import hil
from kiln.commands import add_optimize_argument, positive_int
from kiln.frontend.files import ensure_output_dir


def add_arguments(p):
    p.add_argument("model", help=".tflite, Kiln graph .json, or a package folder from `kiln compile`")
    add_optimize_argument(p)
    p.add_argument("--board", required=True, help="board name (see `kiln boards`)")
    p.add_argument("-o", "--out", default=None, help="output folder (default: build/<board>)")
    p.add_argument("--emulate", action="store_true",
                   help="for a real board: build its QEMU stand-in instead (the emulated machine with the same "
                        "core, the real board's flash and RAM sizes)")
    p.add_argument("--stack-size", type=positive_int, default=8192, help="stack bytes (default 8192)")


def run(args):
    out = ensure_output_dir(args.out or os.path.join("build", args.board), "output folder (-o)")
    # a real board's image by default; --emulate: its QEMU stand-in (same core and memory sizes)
    image, pkg_dir = hil.build_for_board(args.model, args.board, out, emulate=args.emulate,
                                         stack_size=args.stack_size, optimize=args.optimize)
    sizes = image.sizes.to_dict()
    rep = {"board": args.board, "package": pkg_dir, "elf": str(image.elf), "bin": str(image.bin),
           "hex": str(image.hex), "sizes": sizes}
    # two flash figures: the whole image (flash_bytes = sizes.flash_used) and the model's share
    # counted like TFLM's "library .text + model" (kiln.firmware.sizes.flash_split, from the map)
    split = hil.flash_split(image)
    rep["flash_bytes"] = image.sizes.flash_used
    if split is not None:
        rep.update(model_flash_bytes=split.model_flash_bytes, harness_flash_bytes=split.harness_bytes,
                   flash_breakdown=split.breakdown, flash_by_file=split.by_file)
    rep["text"] = (f"built {image.elf}\n  also {image.bin}, {image.hex}\n\n{image.sizes}"
                   + (f"\n\n{split}" if split is not None else ""))
    return rep
