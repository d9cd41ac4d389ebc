"""Writing benchmark tables into docs/: each tool owns one '## Title' section of a Markdown file."""
from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS_MD = os.path.join(ROOT, "docs", "benchmarks.md")


def write_section(path, text):
    """Replace the section whose first line is ``text``'s first line (a '## Title' header) in the
    Markdown file at ``path``, or append it; other sections are left untouched."""
    header = text.splitlines()[0].rstrip()
    if not header.startswith("## "):
        raise ValueError(f"a section must start with a '## ' header, got {header!r}")
    old = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    pat = re.compile(rf"^{re.escape(header)}[ \t]*\n.*?(?=^## |\Z)", re.S | re.M)
    body = text.rstrip("\n") + "\n"
    if pat.search(old):
        new = pat.sub(lambda m: body + "\n", old, count=1).rstrip("\n") + "\n"
    else:
        new = old.rstrip("\n") + "\n\n" + body
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(new)
