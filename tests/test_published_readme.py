"""The published loadax 0.2 README's examples run as written, import paths included.

`reference/loadax-0.2-readme.txt` is that README as its package page shows it (a copy of the
project's shared reference, kept here because CI runs on a clean clone). The page text has lost
its Markdown fences, so each example is found by its first and last lines, in the order the README
has them; a test checks that no line of code lies outside the examples found. The examples run in
order in one namespace, as a reader would paste them, with the substitutions of `SUBSTITUTIONS`.

Where an example prints, its `# Output:` comments are what it must print, except where the README
is wrong (`CORRECTED`): there the test checks that the README still says what it says and that the
example prints the truth.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import time
from pathlib import Path

import jax

README = Path(__file__).parent / "reference" / "loadax-0.2-readme.txt"


@dataclasses.dataclass(frozen=True)
class Example:
    """An example of the README: from the line `first` (the first after the previous example) to
    the `nth_last`-th line `last` after it, both included."""

    name: str
    first: str
    last: str
    nth_last: int = 1


EXAMPLES = (
    Example("data loading", "from loadax import DataLoader, InMemoryDataset, Batcher", "# [9, 10]"),
    Example(
        "stateless loader",
        "dataloader = DataLoader(batcher).batch_size(2).build(dataset)",
        "# Output: 1",
        nth_last=2,  # two iterators, each with its "# Output: 1"
    ),
    Example("prefetching", "from loadax import DataLoader, InMemoryDataset, Batcher", "# [9, 10]"),
    Example(
        "multiple workers",
        "from loadax import DataLoader, RangeDataset, MappedDataset, Batcher",
        "# [16, 18]",
    ),
    Example(
        "distributed loading",
        "from loadax import DataLoader, InMemoryDataset, Batcher",
        "    loss = train_step(model, optimizer, global_batch)",
    ),
    Example("type hinting", "from loadax import DataLoader, RangeDataset, Batcher", "# [9, 10]"),
    Example(
        "datasets",
        "dataset = InMemoryDataset([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])",
        "dataset = RangeDataset(0, 10)",
    ),
    Example(
        "transformations",
        "from loadax import MappedDataset, RangeDataset, ShuffledDataset",
        "dataset = MappedDataset(base_dataset, slow_fn)",
    ),
)

SUBSTITUTIONS: dict[str, list[tuple[str, str]]] = {
    # `create_model()`'s body is `...`, which returns None: `model, optimizer = create_model()`
    # needs a pair. The training step's loss is a comment ending in "...": `loss` is never set.
    "distributed loading": [
        (
            "    # Create your model and shard however you like (see fsdp example for zero style "
            "fsdp)\n    ...\n",
            "    # Create your model and shard however you like (see fsdp example for zero style "
            "fsdp)\n    return None, None\n",
        ),
        (
            "    # Your loss calculation logic...\n",
            "    loss = jnp.sum(batch)  # Your loss calculation logic...\n",
        ),
    ],
}
"""Per example: (text as the README has it, the text run instead), each found exactly once.

Besides these, the namespace the examples run in starts with `time` imported: `slow_fn` of the
"multiple workers" and "transformations" examples calls `time.sleep` and neither imports `time`.
The "# Standard jax distributed setup" placeholder, a bare `...`, runs as written (one process).
"""

CORRECTED = {
    # A batch of `Batcher(lambda x: x)` is its list of records, not the first record.
    "stateless loader": ("1\n1\n", "[1, 2]\n[1, 2]\n"),
    # `my_fn` sums the records of a batch of two: 0 + 1, 2 + 3, ...
    "type hinting": (
        "[1, 2]\n[3, 4]\n[5, 6]\n[7, 8]\n[9, 10]\n",
        "1\n5\n9\n13\n17\n",
    ),
}
"""Per example whose printed output the README gets wrong: (what it says, what it prints)."""

CODE_LINE = re.compile(r"^(from \w|import \w|\w+(, \w+)* = |for \w+ in |def \w+\(|print\()")
"""A line that can only be code; prose, titles and shell commands do not look like this."""


def _extracted(lines: list[str]) -> list[tuple[Example, range]]:
    """Each example with the numbers of its lines, found in order; an AssertionError names the
    example not found."""
    found, start = [], 0
    for example in EXAMPLES:
        try:
            first = last = lines.index(example.first, start)
            for _ in range(example.nth_last):
                last = lines.index(example.last, last + 1)
        except ValueError:
            raise AssertionError(f"example {example.name!r} not found after line {start}") from None
        found.append((example, range(first, last + 1)))
        start = last + 1
    return found


def _examples() -> list[tuple[Example, str]]:
    """Each example with its code, as the README has it."""
    lines = README.read_text().splitlines()
    return [
        (example, "".join(f"{lines[number]}\n" for number in numbers))
        for example, numbers in _extracted(lines)
    ]


def _claimed_output(code: str) -> str:
    """What the example's comments say it prints: "# Output: x" or "# Output:" and "# x" lines."""
    printed, listing = [], False
    for line in code.splitlines():
        if line.startswith("# Output:"):
            rest = line.removeprefix("# Output:").strip()
            listing = not rest
            printed += [rest] if rest else []
        elif listing and line.startswith("# "):
            printed.append(line.removeprefix("# "))
        else:
            listing = False
    return "".join(f"{line}\n" for line in printed)


def _substituted(example: Example, code: str) -> str:
    for original, replacement in SUBSTITUTIONS.get(example.name, []):
        assert code.count(original) == 1, f"{example.name}: {original!r} is not there once"
        code = code.replace(original, replacement)
    return code


def test_every_line_of_code_of_the_readme_is_in_an_example() -> None:
    lines = README.read_text().splitlines()
    inside = {number for _, numbers in _extracted(lines) for number in numbers}
    outside = [
        f"line {number + 1}: {line}"
        for number, line in enumerate(lines)
        if number not in inside and CODE_LINE.match(line)
    ]
    assert not outside, "code outside the examples found:\n" + "\n".join(outside)


def test_the_published_readme_examples_run_as_written_and_print_the_truth() -> None:
    namespace: dict[str, object] = {"__name__": "loadax_0_2_readme", "time": time}
    for example, code in _examples():
        output = io.StringIO()
        with contextlib.redirect_stdout(output):
            exec(compile(_substituted(example, code), example.name, "exec"), namespace)
        claimed = _claimed_output(code)
        if example.name in CORRECTED:
            says, prints = CORRECTED[example.name]
            assert claimed == says, f"{example.name}: the README now says {claimed!r}"
            assert output.getvalue() == prints, example.name
        else:
            assert output.getvalue() == claimed, example.name
        if example.name == "distributed loading":
            # The last global batch: the dataset's last 8 records, laid out on the fsdp mesh.
            batch = namespace["global_batch"]
            assert isinstance(batch, jax.Array)
            assert batch.tolist() == list(range(120, 128))
            assert batch.sharding.mesh == namespace["mesh"]  # type: ignore[attr-defined]
        if example.name == "transformations":
            assert sorted(namespace["dataset"]) == list(range(0, 20, 2))  # type: ignore[call-overload]


def test_the_readme_example_outputs_are_read_from_its_comments() -> None:
    code = "print(1)\n# Output:\n# [1, 2]\n# [3]\n\nx = 1\n# Output: 1\n"
    assert _claimed_output(code) == "[1, 2]\n[3]\n1\n"
