"""The wheel and the sdist hold what they should, and loadax.server/client have one identity.

The distributions are built offline and without build isolation, by setuptools' PEP 517 hooks in
a process of their own, from a copy of the files git would commit (tracked, and untracked but not
ignored), so that what a developer has built locally cannot leak into them.
"""

from __future__ import annotations

import configparser
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import loadax

ROOT = Path(__file__).resolve().parent.parent
SUBPACKAGES = (
    "sources",
    "dataset",
    "plan",
    "collate",
    "execution",
    "iterators",
    "delivery",
    "wire",
    "wire/v1",
    "state",
    "server",
    "client",
    "client/transports",
)
"""The packages inside loadax/ that the wheel must hold (server and client from their folders)."""
MAPPED = {"server": "loadax/server", "client": "loadax/client"}
"""Top-level folders and where the wheel puts them."""
DIST_INFO = f"loadax-{loadax.__version__}.dist-info"
BUILD = """
import json, sys
from setuptools import build_meta

out, sdist = sys.argv[1], sys.argv[2:] == ["sdist"]  # read first: the hooks rewrite sys.argv
names = [build_meta.build_wheel(out)] + ([build_meta.build_sdist(out)] if sdist else [])
print(json.dumps(names))
"""


@dataclasses.dataclass(frozen=True)
class Built:
    source: Path  # the copy the distributions were built from
    wheel_path: Path
    sdist_path: Path
    wheel: frozenset[str]  # the wheel's file names
    sdist: frozenset[str]  # the sdist's file names, below its top folder

    def entry_points(self) -> configparser.ConfigParser:
        parser = configparser.ConfigParser()
        with zipfile.ZipFile(self.wheel_path) as wheel:
            parser.read_string(wheel.read(f"{DIST_INFO}/entry_points.txt").decode())
        return parser


def build(source: Path, out: Path, *, sdist: bool) -> list[Path]:
    """Build the wheel (and the sdist) of `source` into `out`; their paths."""
    done = subprocess.run(
        [sys.executable, "-c", BUILD, str(out), *(["sdist"] if sdist else [])],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [out / name for name in json.loads(done.stdout.splitlines()[-1])]


def wheel_names(path: Path) -> frozenset[str]:
    with zipfile.ZipFile(path) as wheel:
        return frozenset(wheel.namelist())


def committable_copy(destination: Path) -> Path:
    """The files of the repository that git would commit, copied to `destination`."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():  # tracked files deleted in the working tree are gone
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, destination / name)
    return destination


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    directory = tmp_path_factory.mktemp("packaging")
    source = committable_copy(directory / "source")
    (directory / "dist").mkdir()
    wheel, sdist = build(source, directory / "dist", sdist=True)
    with tarfile.open(sdist) as archive:
        top = f"loadax-{loadax.__version__}/"
        names = frozenset(name.removeprefix(top) for name in archive.getnames())
    return Built(source, wheel, sdist, wheel_names(wheel), names)


def test_the_wheel_holds_the_server_and_the_client_inside_loadax(built: Built) -> None:
    for folder, package in MAPPED.items():
        modules = (built.source / folder).rglob("*.py")
        expected = {f"{package}/{path.relative_to(built.source / folder)}" for path in modules}
        shipped = {name for name in built.wheel if name.startswith(f"{package}/")}
        assert f"{package}/__init__.py" in expected
        assert shipped == expected, f"{folder}/ should ship as {package}/"


def test_the_wheel_holds_every_subpackage_and_module_of_the_core(built: Built) -> None:
    for package in SUBPACKAGES:
        assert f"loadax/{package}/__init__.py" in built.wheel, f"loadax/{package} is missing"
    assert "loadax/py.typed" in built.wheel
    core = built.source / "loadax"
    modules = {path.relative_to(built.source).as_posix() for path in core.rglob("*.py*")}
    assert modules, "no modules found in loadax/"
    missing = sorted(modules - built.wheel)
    assert not missing, f"modules of loadax/ missing from the wheel: {missing}"


def test_the_wheel_holds_loadax_alone(built: Built) -> None:
    tops = {name.split("/")[0] for name in built.wheel}
    for stray in ("server", "client", "tests", "benchmarks", "examples"):
        assert stray not in tops, f"the wheel has a top-level {stray}/ package"
    assert tops == {"loadax", DIST_INFO}


def test_the_wheel_installs_the_two_commands(built: Built) -> None:
    scripts = dict(built.entry_points()["console_scripts"])
    assert scripts == {
        "loadax": "loadax.client.cli:main",
        "loadax-worker": "loadax.server.main:main",
    }


def test_the_sdist_holds_the_sources_and_the_schema(built: Built) -> None:
    tops = {name.split("/")[0] for name in built.sdist}
    assert {"server", "client", "loadax", "proto", "pyproject.toml", "README.md"} <= tops
    for folder in MAPPED:
        for path in (built.source / folder).glob("*.py"):
            assert f"{folder}/{path.name}" in built.sdist
    assert "proto/loadax/wire/v1/worker.proto" in built.sdist


def test_the_sdist_builds_the_same_wheel(built: Built, tmp_path: Path) -> None:
    with tarfile.open(built.sdist_path) as archive:
        archive.extractall(tmp_path, filter="data")
    (tmp_path / "dist").mkdir()
    [wheel] = build(tmp_path / f"loadax-{loadax.__version__}", tmp_path / "dist", sdist=False)
    assert wheel_names(wheel) == built.wheel


# --- one module identity ----------------------------------------------------------------------

IDENTITY = """
import json
import loadax.client.remote
import loadax.server.worker
print(json.dumps([loadax.client.remote.__file__, loadax.server.worker.__file__]))
"""


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter started in the repository root, which is on its sys.path."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONSAFEPATH"}
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_loadax_server_and_client_are_the_top_level_folders() -> None:
    done = run_python(IDENTITY)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [
        str(ROOT / "client" / "remote.py"),
        str(ROOT / "server" / "worker.py"),
    ]


@pytest.mark.parametrize(("module", "package"), [("client.remote", "client"), ("server", "server")])
def test_the_folders_refuse_to_be_imported_under_their_own_names(module: str, package: str) -> None:
    done = run_python(f"import {module}")
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ImportError: {ROOT / package} is the package loadax.{package}, ")
    assert f"not {package!r}: import loadax.{package} " in last
