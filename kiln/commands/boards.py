"""kiln boards: list the boards Kiln knows (one data file each in boards/)."""
from __future__ import annotations

from kiln import boards


def add_arguments(p):
    p.add_argument("name", nargs="?", help="show one board in full")


def _row(b):
    return {"name": b.name, "emulated": b.emulated, "core": b.core, "fpu": b.fpu, "dsp": b.dsp,
            "clock_hz": b.clock_hz, "flash_bytes": b.flash_region.size, "ram_bytes": b.ram_region.size,
            "flash_origin": b.flash_region.origin, "ram_origin": b.ram_region.origin,
            "uart": {"kind": b.uart.kind, "base": b.uart.base, "baud": b.uart.baud},
            "flash_method": b.flash.method, "qemu_machine": b.qemu.machine,
            "description": b.description}


def _kb(n):
    return f"{n // 1024:,} KB" if n < 1 << 20 else f"{n / (1 << 20):g} MB"


def run(args):
    bs = [boards.load(args.name)] if args.name else boards.all_boards()
    rows = [_row(b) for b in bs]
    head = f"{'board':18} {'kind':9} {'core':14} {'fpu':4} {'dsp':4} {'clock':>8} {'flash':>8} {'RAM':>8}  {'flash with':11} qemu machine"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['name']:18} {'emulated' if r['emulated'] else 'real':9} {r['core']:14} {r['fpu']:4} "
                     f"{'yes' if r['dsp'] else 'no':4} {r['clock_hz'] / 1e6:>6g}MHz {_kb(r['flash_bytes']):>8} "
                     f"{_kb(r['ram_bytes']):>8}  {r['flash_method']:11} {r['qemu_machine']}")
    if args.name:
        r = rows[0]
        lines.append(f"\n{r['description']}\nflash at 0x{r['flash_origin']:08x}, RAM at 0x{r['ram_origin']:08x}, "
                     f"UART {r['uart']['kind']} at 0x{r['uart']['base']:08x} ({r['uart']['baud']} baud)")
    return {"boards": rows, "text": "\n".join(lines)}
