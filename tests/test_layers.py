"""Imports flow one way: `client`/`server` -> the `loadax` core -> nothing of ours, with no cycles.

Every .py file of loadax/, server/ and client/ is parsed (not imported), under the name it is
installed as (server/ is loadax.server, client/ is loadax.client). Every import statement counts:
module-level, inside functions and under `if TYPE_CHECKING:`. Docstring examples are strings, so
they do not.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
from collections import deque
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TREES = {
    "loadax": ROOT / "loadax",
    "loadax.server": ROOT / "server",
    "loadax.client": ROOT / "client",
}


@dataclasses.dataclass(frozen=True)
class Import:
    """One module our module imports, and where."""

    importer: str
    imported: str
    path: Path
    line: int

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}: {self.importer} imports {self.imported}"


def module_names() -> dict[str, Path]:
    """Every module of the three trees by its installed name."""
    modules = {}
    for package, folder in TREES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if package == "loadax" and parts[0] in ("server", "client"):
                continue  # not on disk: setuptools maps them from the top-level folders
            name = ".".join((package, *parts[: -1 if parts[-1] == "__init__" else None]))
            modules[name] = path
    return modules


MODULES = module_names()


def in_tree(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def layer(module: str) -> str | None:
    """The tree `module` belongs to: loadax.server, loadax.client, loadax (the core) or None."""
    return next((tree for tree in reversed(TREES) if in_tree(module, tree)), None)


def resolve(name: str) -> str:
    """`name`, or the deepest of its parents that is one of our modules ('' when none is)."""
    parts = name.split(".")
    while parts and ".".join(parts) not in MODULES:
        parts.pop()
    return ".".join(parts)


def imports_of(module: str, path: Path) -> Iterator[Import]:
    """What `module` imports: each import statement's targets, as the names it reads them by."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, alias.name, path, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:  # relative: from the package, `level - 1` packages up
                base = package.rsplit(".", node.level - 1)[0]
                source = f"{base}.{source}" if source else base
            for alias in node.names:
                # `from package import submodule` imports the submodule.
                submodule = f"{source}.{alias.name}"
                yield Import(
                    module, submodule if submodule in MODULES else source, path, node.lineno
                )


# One entry per statement and module (`from m import a, b` imports m once).
ALL_IMPORTS = list(
    dict.fromkeys(found for module, path in MODULES.items() for found in imports_of(module, path))
)


def offending(importer: str, forbidden: set[str]) -> str:
    """The imports from the tree `importer` into the trees `forbidden`, a line each."""
    return "\n".join(
        str(found)
        for found in ALL_IMPORTS
        if layer(found.importer) == importer and layer(found.imported) in forbidden
    )


def shortest_cycle(graph: Mapping[str, set[str]], start: str) -> list[str] | None:
    """A shortest path of imports from `start` back to itself, [start, ..., start], or None."""
    previous: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for neighbour in sorted(graph.get(node, ())):
            if neighbour == start:
                back = [node]
                while back[-1] != start:
                    back.append(previous[back[-1]])
                return [*reversed(back), start]
            if neighbour not in previous:
                previous[neighbour] = node
                queue.append(neighbour)
    return None


def import_cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The shortest cycle through each node that is on one, each once, from its least node."""
    cycles = set()
    for start in graph:
        if cycle := shortest_cycle(graph, start):
            nodes = cycle[:-1]
            first = nodes.index(min(nodes))
            rotated = nodes[first:] + nodes[:first]
            cycles.add((*rotated, rotated[0]))
    return [list(cycle) for cycle in sorted(cycles)]


def test_every_tree_is_parsed_under_its_installed_name() -> None:
    assert {"loadax", "loadax.delivery.device", "loadax.wire.v1"} <= MODULES.keys()
    assert {"loadax.server.worker", "loadax.client.cli", "loadax.client"} <= MODULES.keys()
    assert MODULES["loadax.server.main"] == ROOT / "server" / "main.py"
    names = ("loadax.plan", "loadax.server.main", "loadax.client", "jax")
    assert [layer(name) for name in names] == ["loadax", "loadax.server", "loadax.client", None]
    # `from loadax.wire.v1 import worker_pb2` imports the module loadax.wire.v1.worker_pb2.
    ping = {found.imported for found in ALL_IMPORTS if found.importer == "loadax.client.ping"}
    assert {"loadax.wire.v1.worker_pb2", "loadax.client.transports.grpc", "grpc"} <= ping
    cli = {found.imported for found in ALL_IMPORTS if found.importer == "loadax.client.cli"}
    assert {"loadax.client.ping", "loadax.client.transports.zmq", "argparse"} <= cli


def test_the_core_imports_neither_the_server_nor_the_client() -> None:
    found = offending("loadax", {"loadax.server", "loadax.client"})
    assert not found, (
        f"the loadax core must import neither loadax.server nor loadax.client:\n{found}"
    )


def test_the_client_never_imports_the_server() -> None:
    found = offending("loadax.client", {"loadax.server"})
    assert not found, f"loadax.client must not import loadax.server:\n{found}"


def test_the_placement_policy_has_no_threads_and_reads_no_clock() -> None:
    # Time is an argument of the policy: tests and simulations drive it on a virtual clock.
    pure = (
        "loadax.client.policy",
        "loadax.client.member_health",
        "loadax.client.fleet_events",
        "loadax.client.fleet_failures",
    )
    found = [
        str(found)
        for found in ALL_IMPORTS
        if found.importer in pure
        and found.imported.partition(".")[0] in ("threading", "time", "concurrent", "asyncio")
    ]
    assert all(module in MODULES for module in pure)
    assert not found, "the placement policy must not import threads or clocks:\n" + "\n".join(found)


def test_no_module_imports_the_top_level_folders() -> None:
    found = [
        str(found)
        for found in ALL_IMPORTS
        if found.imported.partition(".")[0] in ("server", "client")
    ]
    assert not found, "import loadax.server / loadax.client, not the folders:\n" + "\n".join(found)


def test_there_are_no_import_cycles() -> None:
    graph: dict[str, set[str]] = {module: set() for module in MODULES}
    statement: dict[tuple[str, str], Import] = {}
    for found in ALL_IMPORTS:
        if target := resolve(found.imported):
            graph[found.importer].add(target)
            statement.setdefault((found.importer, target), found)
    cycles = import_cycles(graph)
    where = [
        " -> ".join(cycle)
        + ":\n"
        + "\n".join(f"  {statement[edge]}" for edge in itertools.pairwise(cycle))
        for cycle in cycles
    ]
    assert not cycles, "import cycles:\n" + "\n".join(where)


@pytest.mark.parametrize(
    ("graph", "cycles"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c", "a"]]),
        ({"a": {"a"}, "b": {"c"}, "c": {"b"}}, [["a", "a"], ["b", "c", "b"]]),
        ({"a": {"b", "c"}, "b": {"a"}, "c": {"a"}}, [["a", "b", "a"], ["a", "c", "a"]]),
    ],
)
def test_the_cycle_finder_finds_every_cycle(
    graph: dict[str, set[str]], cycles: list[list[str]]
) -> None:
    assert import_cycles(graph) == cycles
