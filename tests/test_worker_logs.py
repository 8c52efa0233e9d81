"""`[server] log_format = "json"` and `--log-format`: a worker's logs on stderr as JSON lines,
its events on stdout as before. Real `loadax-worker` processes."""

from __future__ import annotations

import datetime
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from workers import worker_env, worker_process

from loadax.logfields import NAMES
from loadax.server.config import load_config
from loadax.server.config_checks import ConfigError
from loadax.server.main import EXIT_CONFIG

# A factory module that logs while it is imported: a line, an exception and a warning.
NOISY = """
import logging
import warnings

import pipelines

log = logging.getLogger("noisy")
log.info("importing the noisy factories")
try:
    {}["missing"]
except KeyError:
    log.exception("a lookup failed")
warnings.warn("the noisy factories are noisy", UserWarning, stacklevel=1)


def make():
    return pipelines.numbers()
"""
TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING|ERROR) [\w.]+: ")


def write_config(tmp_path: Path, server: str = "", factory: str = "noisy:make") -> Path:
    (tmp_path / "noisy.py").write_text(NOISY)
    config = tmp_path / "worker.toml"
    config.write_text(
        f'[server]\ngrpc = "127.0.0.1:0"\n{server}\n[pipelines.x]\nfactory = "{factory}"\n'
    )
    return config


def run(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`loadax-worker --config config ARGS`, with the noisy factories importable."""
    return subprocess.run(
        [sys.executable, "-m", "loadax.server.main", "--config", str(config), *args],
        capture_output=True,
        text=True,
        env=worker_env({"PYTHONPATH": str(config.parent)}),
        cwd=config.parent,
        timeout=60,
        check=False,
    )


def json_logs(stderr: str) -> list[dict[str, Any]]:
    """Every line of `stderr`, each a JSON log record with its four fields and a time in UTC,
    and the facts it carries (`loadax.logfields`)."""
    records = []
    for line in stderr.splitlines():
        record = json.loads(line)
        assert (
            {"time", "level", "logger", "message"}
            <= record.keys()
            <= {"time", "level", "logger", "message", "traceback", *NAMES}
        ), line
        time = datetime.datetime.fromisoformat(record["time"])
        assert time.utcoffset() == datetime.timedelta(0), line
        records.append(record)
    return records


def test_a_json_worker_logs_json_lines_on_stderr_and_its_events_on_stdout(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path, 'log_format = "json"')
    with worker_process(tmp_path, config=config, env={"PYTHONPATH": str(tmp_path)}) as worker:
        assert worker.terminate() == 0
    output = worker.output()  # both streams, whole once the worker is gone
    events = [json.loads(line) for line in output.splitlines() if line.startswith('{"event"')]
    assert [event["event"] for event in events] == ["ready", "stopped"]
    records = json_logs(
        "\n".join(line for line in output.splitlines() if not line.startswith('{"event"'))
    )
    by_message = {record["message"]: record for record in records}
    assert by_message["importing the noisy factories"]["logger"] == "noisy"
    failed = by_message["a lookup failed"]
    assert failed["level"] == "ERROR"
    assert failed["traceback"].startswith("Traceback (most recent call last):")
    assert "KeyError: 'missing'" in failed["traceback"]
    (warned,) = (record for record in records if record["logger"] == "py.warnings")
    assert "UserWarning: the noisy factories are noisy" in warned["message"]
    assert warned["level"] == "WARNING"
    served = [record for record in records if record["message"].startswith("serving ['x']")]
    assert served
    assert served[0]["logger"] == "loadax.server"
    assert served[0]["level"] == "INFO"
    assert records[-1]["message"] == "stopped"


def test_the_flag_replaces_the_configs_log_format(tmp_path: Path) -> None:
    text_config = write_config(tmp_path)
    as_json = run(text_config, "--check", "--log-format", "json")
    assert as_json.returncode == 0, as_json.stderr
    assert as_json.stdout.startswith("x: noisy:make(**{})"), as_json.stdout
    assert {r["message"] for r in json_logs(as_json.stderr)} >= {"a lookup failed"}

    json_config = write_config(tmp_path, 'log_format = "json"')
    as_text = run(json_config, "--check", "--log-format", "text")
    assert as_text.returncode == 0, as_text.stderr
    assert re.search(TEXT_LINE.pattern + "a lookup failed$", as_text.stderr, re.MULTILINE)
    assert "Traceback (most recent call last):" in as_text.stderr
    assert not any(line.startswith("{") for line in as_text.stderr.splitlines())


def test_a_json_worker_that_cannot_start_says_why_in_a_json_line(tmp_path: Path) -> None:
    config = write_config(tmp_path, 'log_format = "json"', factory="noisy:absent")
    result = run(config)
    assert result.returncode == EXIT_CONFIG, result.stderr
    *_, refused = json_logs(result.stderr)
    assert refused["level"] == "ERROR"
    assert refused["logger"] == "loadax.server"
    assert refused["message"] == (
        f"{config}: [pipelines.x].factory: 'noisy' has no attribute 'absent' "
        "(factory 'noisy:absent')"
    )


@pytest.mark.parametrize("value", ['"yaml"', '"JSON"', "1", '["json"]'])
def test_an_unknown_log_format_is_a_config_error_naming_the_file_and_key(
    tmp_path: Path, value: str
) -> None:
    config = write_config(tmp_path, f"log_format = {value}")
    with pytest.raises(ConfigError) as error:
        load_config(config)
    assert str(error.value).startswith(
        f'{config}: [server].log_format must be "text" or "json", got '
    )


def test_the_log_format_defaults_to_text(tmp_path: Path) -> None:
    assert load_config(write_config(tmp_path)).log_format == "text"
    assert load_config(write_config(tmp_path, 'log_format = "json"')).log_format == "json"
