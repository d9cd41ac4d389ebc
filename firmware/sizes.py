"""Flash/RAM accounting from ``arm-none-eabi-size -A``, and the model's share of flash from the
linker map.

flash = .text (+ .ARM.exidx, + .boot2 on the RP2040) + .rodata + .data (its load image)
RAM   = .data + .bss + .stack + .noinit        (the arena is part of .bss)

:func:`flash_split` splits that same flash figure into what comes from the compiled model
package (kernels, command buffer, weights and requantisation tables, and the command-buffer run
loop ``kiln_model_run`` in the package's model.c): ``model_flash_bytes``, the quantity
TensorFlow Lite Micro reports as "library .text + model", and the test harness around it
(protocol, UART driver, startup and vector table, profiler, stack painter, libc/libgcc, linker
padding). It reads every input section placed in a flash output section from the GNU ld map
file (``firmware.map``) and attributes its size to the object file it came from.
"""
from __future__ import annotations

import os
import re
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kiln.common.errors import KilnError

_FLASH_ONLY = (".boot2", ".text", ".rodata", ".ARM.exidx")   # .boot2: the RP2040 second stage
_RAM_ONLY = (".bss", ".stack", ".noinit")


@dataclass
class SizeReport:
    text: int
    rodata: int
    data: int
    bss: int
    stack: int
    arena: int
    flash_used: int
    flash_total: int
    ram_used: int
    ram_total: int
    sections: dict[str, int] = field(default_factory=dict)

    @property
    def flash_free(self) -> int:
        return self.flash_total - self.flash_used

    @property
    def ram_free(self) -> int:
        return self.ram_total - self.ram_used

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(flash_free=self.flash_free, ram_free=self.ram_free)
        return d

    def __str__(self) -> str:
        def pct(a, b):
            return f"{100.0 * a / b:5.1f}%" if b else "  n/a"
        return (f"  .text {self.text:>9} B   .rodata {self.rodata:>9} B   .data {self.data:>7} B\n"
                f"  .bss  {self.bss:>9} B   (arena {self.arena} B)   .stack {self.stack:>7} B\n"
                f"  flash {self.flash_used:>9} / {self.flash_total} B ({pct(self.flash_used, self.flash_total)})\n"
                f"  RAM   {self.ram_used:>9} / {self.ram_total} B ({pct(self.ram_used, self.ram_total)})")


def parse_size_output(text: str, *, flash_total: int, ram_total: int, arena: int = 0) -> SizeReport:
    sections: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0].startswith(".") and parts[1].isdigit():
            sections[parts[0]] = int(parts[1])
    g = sections.get
    text_b = g(".boot2", 0) + g(".text", 0) + g(".ARM.exidx", 0)
    data = g(".data", 0)
    flash_used = sum(g(s, 0) for s in _FLASH_ONLY) + data
    ram_used = data + sum(g(s, 0) for s in _RAM_ONLY)
    return SizeReport(text=text_b, rodata=g(".rodata", 0), data=data, bss=g(".bss", 0),
                      stack=g(".stack", 0), arena=arena, flash_used=flash_used,
                      flash_total=flash_total, ram_used=ram_used, ram_total=ram_total,
                      sections=sections)


# ---------------------------------------------------------------------------------------------
# model flash vs harness flash, from the linker map

FLASH_SECTIONS = _FLASH_ONLY + (".data",)      # exactly what flash_used counts
BREAKDOWN_KEYS = ("kernels_code", "model_constants", "runtime", "harness")
MODEL_KEYS = ("kernels_code", "model_constants", "runtime")
RUNTIME_SOURCE = "model.c"                     # the package file holding kiln_model_run
PADDING = "(linker script padding)"
_HEX = r"0x[0-9a-fA-F]+"
_ADDR_SIZE = re.compile(rf"^\s+({_HEX})\s+({_HEX})(?:\s+(.*?))?\s*$")
_HEADER = re.compile(rf"^(\S+)(?:\s+({_HEX})\s+({_HEX}))?(?:\s+load address\s+({_HEX}))?\s*$")
_SUFFIX = re.compile(r"\.(constprop|isra|part|cold|lto_priv|localalias)(\.\d+)?")


class MapError(KilnError, ValueError):
    """The linker map cannot be attributed (unexpected format, objects not matching sources)."""


@dataclass
class InputSection:
    output: str          # output section (.text, .rodata, .data, ...)
    name: str            # input section name (.text.kiln_model_run, .rodata.c_conv_w, ...)
    addr: int
    size: int
    file: str            # object / archive member as the map names it


@dataclass
class LinkMap:
    objects: list[str]                         # LOADed object files, command-line order
    outputs: dict[str, tuple[int, int]]        # output section -> (address, size)
    inputs: list[InputSection]


def parse_map(text: str) -> LinkMap:
    """Parse the "Linker script and memory map" part of a GNU ld -Map file."""
    start = text.find("Linker script and memory map")
    if start < 0:
        raise MapError("not a GNU ld map file (no 'Linker script and memory map')")
    lines = text[start:].splitlines()[1:]
    objects: list[str] = []
    outputs: dict[str, tuple[int, int]] = {}
    inputs: list[InputSection] = []
    cur = None                 # current output section
    pending = None             # ("out"|"in", name) waiting for its address line
    for line in lines:
        if not line.strip():
            continue
        if pending is not None:
            kind, name = pending
            pending = None
            m = _ADDR_SIZE.match(line)
            if m:
                addr, size = int(m.group(1), 16), int(m.group(2), 16)
                if kind == "out":
                    cur = name
                    outputs[name] = (addr, size)
                elif cur is not None and m.group(3):
                    inputs.append(InputSection(cur, name, addr, size, m.group(3)))
                continue
            if kind == "out":
                cur = name               # an empty output section (no address): nothing placed
        if not line[0].isspace():
            if line.startswith("LOAD "):
                path = line[5:].strip()
                if path != "linker stubs" and not path.endswith(".a"):
                    objects.append(path)
                continue
            if line.startswith(("START GROUP", "END GROUP", "OUTPUT(", "INPUT(")):
                continue
            m = _HEADER.match(line)
            if not m:
                continue
            if m.group(2) is None:
                pending = ("out", m.group(1))
            else:
                cur = m.group(1)
                outputs[cur] = (int(m.group(2), 16), int(m.group(3), 16))
            continue
        # input section lines start with exactly one space and a section name
        if line[0] == " " and len(line) > 1 and not line[1].isspace() and not line.startswith(" *"):
            parts = line.split(None, 1)
            name = parts[0]
            rest = " " + parts[1] if len(parts) > 1 else ""
            m = _ADDR_SIZE.match(rest) if rest else None
            if m is None:
                pending = ("in", name)
            elif cur is not None and m.group(3):
                inputs.append(InputSection(cur, name, int(m.group(1), 16), int(m.group(2), 16), m.group(3)))
    return LinkMap(objects, outputs, inputs)


def _sources_from_command(map_path: Path) -> list[str]:
    cmd = map_path.parent / "build_command.txt"
    if not cmd.exists():
        raise MapError(f"{cmd} not found: pass the compiled sources explicitly")
    return [t for t in shlex.split(cmd.read_text()) if t.endswith((".c", ".s", ".S"))]


def _identifiers(sections: list[InputSection]) -> set[str]:
    out = set()
    for s in sections:
        for prefix in (".text.startup.", ".text.unlikely.", ".text.hot.", ".text.", ".rodata.",
                       ".data.rel.ro.local.", ".data.rel.ro.", ".data.", ".bss."):
            if s.name.startswith(prefix):
                ident = _SUFFIX.sub("", s.name[len(prefix):]).split(".")[0]
                if re.fullmatch(r"[A-Za-z_]\w*", ident) and not ident.startswith("str"):
                    out.add(ident)
                break
    return out


def _object_sources(lm: LinkMap, sources: list[str]) -> dict[str, str]:
    """Object file as the map names it -> the source it was compiled from.

    gcc compiles the sources of one command line into temporary objects (/tmp/ccXXXXXX.o) and
    hands them to the linker in command-line order, so the k-th LOADed object is the k-th source.
    Objects named after their source (model.o, model.c.o) are matched by name. Every pairing is
    checked: some function or variable named by the object's sections must occur in the source.
    """
    if len(lm.objects) != len(sources):
        raise MapError(f"the map loads {len(lm.objects)} object files but {len(sources)} sources "
                       f"were compiled: cannot attribute sections to sources")
    stems = {Path(s).stem: s for s in sources}
    pairs = {}
    for obj, src in zip(lm.objects, sources):
        base = Path(obj).name
        for suffix in (".c.o", ".o", ".obj"):
            if base.endswith(suffix) and base[: -len(suffix)] in stems:
                src = stems[base[: -len(suffix)]]
                break
        pairs[obj] = src
    by_obj: dict[str, list[InputSection]] = {}
    for s in lm.inputs:
        by_obj.setdefault(s.file, []).append(s)
    for obj, src in pairs.items():
        idents = _identifiers(by_obj.get(obj, []))
        if not idents or not os.path.exists(src):
            continue
        text = Path(src).read_text(errors="replace")
        if not any(re.search(rf"\b{re.escape(i)}\b", text) for i in idents):
            raise MapError(f"object {obj} (sections for {sorted(idents)[:4]}) does not look compiled "
                           f"from {src}: cannot attribute sections to sources")
    return pairs


@dataclass
class FlashSplit:
    """Flash of the whole image split into the model's share and the harness's."""
    flash_bytes: int                 # whole image: .text + .rodata + .data (= SizeReport.flash_used)
    model_flash_bytes: int           # kernels_code + model_constants + runtime
    harness_bytes: int
    breakdown: dict[str, int]        # BREAKDOWN_KEYS -> bytes; sums to flash_bytes
    by_file: dict[str, int]          # source file / archive member -> bytes; sums to flash_bytes
    merged: list[str] = field(default_factory=list)   # mergeable sections ld folded into one object

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        b = self.breakdown
        return (f"  flash, whole image {self.flash_bytes:>9,} B   (.text + .rodata + .data of the firmware)\n"
                f"  flash, model       {self.model_flash_bytes:>9,} B   (kernels code {b['kernels_code']:,} + "
                f"constants {b['model_constants']:,} + runtime {b['runtime']:,}; TFLM's library + model)\n"
                f"  flash, harness     {self.harness_bytes:>9,} B   (protocol, UART, startup, profiler, libc)")


def flash_split(map_path: str | os.PathLike, package_dir: str | os.PathLike,
                sources: list[str] | None = None) -> FlashSplit:
    """Attribute every byte of flash in ``map_path`` to the model package or the harness.

    sources: the compiled source files in command-line order (default: read from
    build_command.txt beside the map, which :func:`kiln.firmware.build` writes).

    Flash = the output sections .text, .rodata, .ARM.exidx and .data (its load image), the same
    set as SizeReport.flash_used. Each input section in them counts for its object file; the
    alignment gap before an input section counts for that section (its alignment caused it),
    a gap at the end of an output section (the linker script's ALIGN) for the harness. Package
    files (in ``package_dir``): .text.* of model.c is ``runtime`` (kiln_model_run, the loop over
    the command buffer); other package code is ``kernels_code``; package .rodata/.data is
    ``model_constants`` (weights, requantisation tables, command buffer, kernel table).
    Everything else (firmware/runtime, UART driver, startup, libc, libgcc) is ``harness``.
    """
    map_path = Path(map_path)
    lm = parse_map(map_path.read_text(errors="replace"))
    srcs = list(sources) if sources is not None else _sources_from_command(map_path)
    pairs = _object_sources(lm, srcs)
    pkg = Path(package_dir).resolve()

    def owner(sec: InputSection) -> tuple[str, str]:
        src = pairs.get(sec.file)
        if src is None:                    # archive member, linker stubs
            m = re.search(r"([^/\\]+\.a\([^)]*\))$", sec.file)
            return "harness", m.group(1) if m else sec.file
        path = Path(src).resolve()
        if path.parent != pkg:
            return "harness", path.name
        if sec.output in (".rodata", ".data"):
            return "model_constants", path.name
        if path.name == RUNTIME_SOURCE:
            return "runtime", path.name
        return "kernels_code", path.name

    breakdown = dict.fromkeys(BREAKDOWN_KEYS, 0)
    by_file: dict[str, int] = {}
    merged = []
    total = 0
    for out in FLASH_SECTIONS:
        if out not in lm.outputs:
            continue
        start, size = lm.outputs[out]
        total += size
        pos = start
        secs = sorted((s for s in lm.inputs if s.output == out and s.size), key=lambda s: s.addr)
        for s in secs:
            if s.addr < pos or s.addr + s.size > start + size:
                raise MapError(f"{map_path}: input section {s.name} of {s.file} at {s.addr:#x}+{s.size:#x} "
                               f"overlaps or leaves output section {out}")
            key, f = owner(s)
            n = s.addr + s.size - pos
            breakdown[key] += n
            by_file[f] = by_file.get(f, 0) + n
            pos = s.addr + s.size
        if pos < start + size:
            breakdown["harness"] += start + size - pos
            by_file[PADDING] = by_file.get(PADDING, 0) + start + size - pos
    for s in lm.inputs:     # SHF_MERGE sections: ld keeps the merged blob in the first one
        if s.size == 0 and s.output in FLASH_SECTIONS and re.match(r"\.rodata\.(str|cst)", s.name):
            merged.append(f"{s.name} of {owner(s)[1]} merged into another object's")
    model = sum(breakdown[k] for k in MODEL_KEYS)
    return FlashSplit(flash_bytes=total, model_flash_bytes=model, harness_bytes=breakdown["harness"],
                      breakdown=breakdown, by_file=by_file, merged=merged)


def image_flash_split(image) -> FlashSplit:
    """:func:`flash_split` of a built :class:`kiln.firmware.Image`."""
    if image.package_dir is None:
        raise MapError("the image does not name its package folder")
    return flash_split(image.map, image.package_dir)
