"""`mypy --strict` over the tree; server/ and client/ checked as loadax.server and loadax.client.

They ship inside loadax through setuptools' package-dir; mypy alone would name them by their
folders (`server.worker`), so that their `loadax.server` imports would not resolve. This gives
mypy every file under its installed module name. Run by `make lint`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mypy import build
from mypy.main import process_options
from mypy.modulefinder import BuildSource

ROOT = Path(__file__).resolve().parent.parent
MAPPED = {"loadax.server": ROOT / "server", "loadax.client": ROOT / "client"}


def mapped_sources() -> list[BuildSource]:
    sources = []
    for package, folder in MAPPED.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            module = ".".join((package, *parts[: -1 if parts[-1] == "__init__" else None]))
            sources.append(BuildSource(str(path.relative_to(ROOT)), module))
    return sources


def main() -> int:
    files, options = process_options(["--config-file", str(ROOT / "pyproject.toml")])
    result = build.build([*files, *mapped_sources()], options)
    for line in result.errors:
        print(line)
    print(f"mypy: {len(result.errors)} error lines", file=sys.stderr)
    return 1 if result.errors else 0


if __name__ == "__main__":
    sys.exit(main())
