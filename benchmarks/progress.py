"""The suite's progress bar on stderr: one line redrawn in a terminal, a line per step elsewhere."""

from __future__ import annotations

import sys
import time
from typing import TextIO

WIDTH = 24


class Progress:
    """Counts `total` steps; `step(label)` announces the next one, `note(text)` prints above."""

    def __init__(self, total: int, stream: TextIO = sys.stderr) -> None:
        self._total, self._done, self._stream = total, 0, stream
        self._started = time.monotonic()
        self._live = stream.isatty()
        self._label = ""

    def step(self, label: str) -> None:
        self._label = label
        self._draw()
        self._done += 1

    def note(self, text: str) -> None:
        if self._live:
            self._stream.write("\r\033[K")
        self._stream.write(text + "\n")
        if self._live and self._label:
            self._draw()
        self._stream.flush()

    def finish(self) -> None:
        self._label = "done"
        self._draw()
        if self._live:
            self._stream.write("\n")
        self._stream.flush()

    def _draw(self) -> None:
        filled = WIDTH * self._done // max(1, self._total)
        elapsed = int(time.monotonic() - self._started)
        line = (
            f"[{'#' * filled}{'.' * (WIDTH - filled)}] {self._done}/{self._total} "
            f"{elapsed // 60}:{elapsed % 60:02d} {self._label}"
        )
        self._stream.write(f"\r\033[K{line}" if self._live else line + "\n")
        self._stream.flush()
