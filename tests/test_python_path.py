"""`[server] python_path`: folders, relative to the config's, from which the worker and its child
processes import the factories, without PYTHONPATH. Real `loadax-worker` processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from workers import worker_process

from loadax import Batcher, DataLoader
from loadax.client import RemoteDataLoader
from loadax.server.config import load_config, load_factory
from loadax.server.config_checks import ConfigError

# The user's project: a package under src/ whose factory uses a helper module from ../lib.
PIPELINES = """
import json
import os
import sys
from pathlib import Path

import loadax
from scaling import SCALE

# Each process that imports the factories leaves its pid and sys.path where the test reads them.
Path(__file__).parents[3].joinpath("imported", str(os.getpid())).write_text(json.dumps(sys.path))


def scaled(index):
    return {"x": index * SCALE}


def make(records=32):
    return loadax.Pipeline(loadax.RangeDataset(0, records).map(scaled), loadax.Batcher())
"""


def project(tmp_path: Path, server: str = "") -> Path:
    """tmp_path/project/worker.toml, its factories in project/src/mypipe and tmp_path/lib."""
    root = tmp_path / "project"
    (root / "src" / "mypipe").mkdir(parents=True)
    (root / "src" / "mypipe" / "__init__.py").write_text("")
    (root / "src" / "mypipe" / "pipelines.py").write_text(PIPELINES)
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "scaling.py").write_text("SCALE = 3\n")
    (tmp_path / "imported").mkdir()
    config = root / "worker.toml"
    config.write_text(
        '[server]\ngrpc = "127.0.0.1:0"\npython_path = ["src", "../lib"]\n'
        f'{server}\n[pipelines.x]\nfactory = "mypipe.pipelines:make"\n'
    )
    return config


@pytest.fixture
def own_imports() -> Iterator[None]:
    """sys.path and the modules of the test's project, as they were before it."""
    saved = list(sys.path)
    try:
        yield
    finally:
        sys.path[:] = saved
        for module in ("mypipe", "mypipe.pipelines", "scaling"):
            sys.modules.pop(module, None)


def imported(tmp_path: Path) -> dict[int, list[str]]:
    """The sys.path of each process that imported the factories, by pid."""
    return {
        int(marker.name): json.loads(marker.read_text())
        for marker in (tmp_path / "imported").iterdir()
    }


def test_check_imports_the_factories_from_python_path_without_pythonpath(tmp_path: Path) -> None:
    config = project(tmp_path)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-m", "loadax.server.main", "--config", str(config), "--check"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path / "lib",  # neither the config's folder nor the project's
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("x: mypipe.pipelines:make(**{}) -> 32 records"), result.stdout
    (path,) = imported(tmp_path).values()
    assert path[:2] == [str(tmp_path / "project" / "src"), str(tmp_path / "lib")]


def test_child_processes_import_the_factories_from_python_path(tmp_path: Path) -> None:
    config = project(tmp_path, "processes = 1")
    with worker_process(tmp_path, config=config) as worker:
        loader = RemoteDataLoader([worker.address("grpc")], pipeline="x").batch_size(8).build()
        with iter(loader) as batches:
            first = next(batches)
        np.testing.assert_array_equal(first["x"], np.arange(8) * 3)
        assert worker.terminate() == 0
        paths = imported(tmp_path)
    children = {pid: path for pid, path in paths.items() if pid != worker.process.pid}
    assert worker.process.pid in paths
    assert children, "no child process imported the factories"
    src, lib = str(tmp_path / "project" / "src"), str(tmp_path / "lib")
    for path in paths.values():
        assert path[:2] == [src, lib]


def test_factories_are_imported_from_python_path_in_this_process(
    tmp_path: Path, own_imports: None
) -> None:
    config = load_config(project(tmp_path))
    assert config.python_path == (str(tmp_path / "project" / "src"), str(tmp_path / "lib"))
    (pipeline,) = config.pipelines
    made = load_factory(config, pipeline)()
    batch = next(iter(DataLoader(Batcher()).batch_size(4).build(made.dataset)))
    np.testing.assert_array_equal(batch["x"], [0, 3, 6, 9])
    load_factory(config, pipeline)
    assert sys.path.count(str(tmp_path / "lib")) == 1


def test_an_absolute_folder_is_taken_as_it_is(tmp_path: Path) -> None:
    config = tmp_path / "worker.toml"
    (tmp_path / "elsewhere").mkdir()
    config.write_text(
        f'[server]\ngrpc = "127.0.0.1:0"\npython_path = ["{tmp_path / "elsewhere"}"]\n'
        '[pipelines.x]\nfactory = "m:f"\n'
    )
    assert load_config(config).python_path == (str(tmp_path / "elsewhere"),)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ('["src", "missing"]', "[server].python_path: 'missing' does not exist ({tmp}/missing;"),
        ('["worker.toml"]', "[server].python_path: 'worker.toml' is not a folder"),
        ('"src"', '[server].python_path must be a list of folders (e.g. ["src", "../lib"]), got'),
        ('["src", 3]', "[server].python_path must be a list of folders"),
        ('[""]', "[server].python_path must be a list of folders"),
    ],
)
def test_a_bad_python_path_is_a_config_error_naming_the_file_key_and_folder(
    tmp_path: Path, value: str, expected: str
) -> None:
    (tmp_path / "src").mkdir()
    config = tmp_path / "worker.toml"
    config.write_text(
        f'[server]\ngrpc = "127.0.0.1:0"\npython_path = {value}\n[pipelines.x]\nfactory = "m:f"\n'
    )
    with pytest.raises(ConfigError) as error:
        load_config(config)
    assert str(error.value).startswith(f"{config}: {expected.format(tmp=tmp_path)}"), error.value


@pytest.mark.parametrize("python_path", [None, '["src"]'])
def test_a_module_that_is_not_importable_points_at_python_path(
    tmp_path: Path, own_imports: None, python_path: str | None
) -> None:
    (tmp_path / "src").mkdir()
    config = tmp_path / "worker.toml"
    setting = "" if python_path is None else f"python_path = {python_path}\n"
    config.write_text(
        f'[server]\ngrpc = "127.0.0.1:0"\n{setting}[pipelines.x]\nfactory = "mypipe:make"\n'
    )
    loaded = load_config(config)
    with pytest.raises(ConfigError) as error:
        load_factory(loaded, loaded.pipelines[0])
    message = str(error.value)
    assert message.startswith(
        f"{config}: [pipelines.x].factory: module 'mypipe' is not importable: "
        "No module named 'mypipe'; "
    )
    if python_path is None:
        assert message.endswith(
            "install it, or list the folder that holds it in [server] python_path (relative "
            'to the config\'s folder, e.g. python_path = ["src"])'
        )
    else:
        assert message.endswith(
            f"it is neither installed nor in [server] python_path ({tmp_path / 'src'})"
        )
