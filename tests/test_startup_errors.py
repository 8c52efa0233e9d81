"""Start-up failures of a worker name the file, the key and the cause, and exit non-zero, with and
without `--check`: factory modules that exit, parse the command line or are interrupted at import,
and factories that exit. Real `loadax-worker` processes."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from workers import worker_env

from loadax.server.main import EXIT_CONFIG, EXIT_START

MODULES = {
    "exits_at_import": "import sys\nsys.exit(0)\n",
    "interrupted_at_import": "raise KeyboardInterrupt\n",
    "factory_exits": "import sys\n\ndef make():\n    sys.exit(5)\n",
}
FAILURES = {
    "exits_at_import": "importing module 'exits_at_import' failed: it called sys.exit(0)",
    "interrupted_at_import": "importing module 'interrupted_at_import' failed: KeyboardInterrupt",
    "factory_exits": "factory_exits:make(**{}) raised it called sys.exit(5) (SystemExit)",
}
# A module that parses the command line at import, as scripts do: it sees no worker argument.
PARSES_ARGV = """
import argparse

import pipelines

options = argparse.ArgumentParser().parse_args()


def make():
    return pipelines.numbers()
"""


def run_worker(
    tmp_path: Path, listen: str, factory: str, *args: str
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """A worker (or `--check`) listening as `listen` (a `[server]` line) with one pipeline made
    by `factory`; modules written in `tmp_path` are importable. The config's path, and how the
    process ended."""
    config = tmp_path / "worker.toml"
    config.write_text(f'[server]\n{listen}\n\n[pipelines.x]\nfactory = "{factory}"\n')
    env = worker_env()
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    result = subprocess.run(
        [sys.executable, "-m", "loadax.server.main", "--config", str(config), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    return config, result


def run_module(
    tmp_path: Path, module: str, source: str, *args: str
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """`run_worker` with the pipeline of `module`, written from `source`."""
    (tmp_path / f"{module}.py").write_text(source)
    factory = f"{module}:make" if "def make" in source else f"{module}:anything"
    return run_worker(tmp_path, 'grpc = "127.0.0.1:0"', factory, *args)


@pytest.mark.parametrize("check", [False, True])
@pytest.mark.parametrize("module", list(MODULES))
def test_user_code_that_stops_the_worker_is_a_config_error_naming_it(
    tmp_path: Path, module: str, check: bool
) -> None:
    config, result = run_module(tmp_path, module, MODULES[module], *(["--check"] if check else []))
    stderr = result.stderr
    assert result.returncode == EXIT_CONFIG, stderr
    assert f"loadax-worker: {config}: [pipelines.x].factory: " in stderr, stderr
    assert FAILURES[module] in stderr, stderr
    assert "Traceback" not in stderr, stderr


def test_a_module_that_parses_the_command_line_at_import_sees_none_of_the_workers(
    tmp_path: Path,
) -> None:
    _, result = run_module(tmp_path, "parses_argv", PARSES_ARGV, "--check")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("x: parses_argv:make(**{}) -> 100 records"), result.stdout


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_a_port_in_use_is_named_so(tmp_path: Path, transport: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        listen = f'grpc = "127.0.0.1:{port}"'
        if transport == "zmq":
            listen = f'zmq = "tcp://127.0.0.1:{port}"'
        _, result = run_worker(tmp_path, listen, "pipelines:numbers")
    assert result.returncode == EXIT_START, result.stderr
    assert f"127.0.0.1:{port}" in result.stderr, result.stderr
    assert "address already in use" in result.stderr.lower(), result.stderr
