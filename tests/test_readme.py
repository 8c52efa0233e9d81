"""The README's Python blocks run in order, and each prints exactly the text block after it."""

from __future__ import annotations

import contextlib
import io
import pathlib
import re

README = pathlib.Path(__file__).parent.parent / "README.md"
# "```python notest" marks an example that needs machines the suite does not have.
BLOCK = re.compile(r"```([\w ]+)\n(.*?)```", re.DOTALL)


def _examples() -> list[tuple[str, str]]:
    blocks = BLOCK.findall(README.read_text())
    examples = []
    for position, (language, code) in enumerate(blocks):
        if language != "python":
            continue
        following = blocks[position + 1] if position + 1 < len(blocks) else ("", "")
        examples.append((code, following[1] if following[0] == "text" else ""))
    return examples


def test_readme_has_runnable_examples() -> None:
    assert len(_examples()) >= 5


def test_readme_examples_print_what_the_readme_shows() -> None:
    namespace: dict[str, object] = {"__name__": "readme"}
    for code, expected in _examples():
        output = io.StringIO()
        with contextlib.redirect_stdout(output):
            exec(compile(code, str(README), "exec"), namespace)
        assert output.getvalue() == expected, code
