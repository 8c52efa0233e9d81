"""The worker's TOML config: listen addresses, limits, and the pipeline factories it serves.

Every mistake is a `ConfigError` naming the file and the key, found before the worker listens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from loadax import factories
from loadax.execution.pipeline import Pipeline
from loadax.factories import (
    PipelineConfig,
    parse_pipeline,
    parse_python_path,
    read_toml,
)
from loadax.server.config_addresses import listen_address, zmq_endpoint
from loadax.server.config_checks import ConfigError, check_keys, show
from loadax.server.config_security import (
    CurveConfig,
    TlsConfig,
    parse_curve,
    parse_tls,
    parse_token,
)
from loadax.validation import is_int

_SERVER_KEYS = (
    "grpc",
    "zmq",
    "metrics",
    "threads",
    "processes",
    "request_deadline_s",
    "max_in_flight_per_client",
    "memory_budget_mb",
    "token_file",
    "tls",
    "curve",
    "log_format",
    "python_path",
    "shared_memory",
    "share_cache_mb",
    "zmq_data_port",
    "grpc_data_port",
)
LOG_FORMATS = ("text", "json")


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerConfig:
    """A parsed config; `source` is the file it came from, for error messages.

    `token`, when set, is the shared secret every request must carry.
    """

    source: str
    pipelines: tuple[PipelineConfig, ...]
    grpc: str | None = None
    zmq: str | None = None
    metrics: str | None = None  # where the Prometheus exporter listens
    threads: int = 4
    processes: int = 0  # child processes per pipeline that load its batches; 0: threads do
    request_deadline_s: float = 60.0  # loading one request's work may take this long
    max_in_flight_per_client: int = 16
    # Batches being built and encoded, at most; None: a share of the machine's memory.
    memory_budget_bytes: int | None = None
    tls: TlsConfig | None = None
    curve: CurveConfig | None = None
    token: str | None = dataclasses.field(default=None, repr=False)
    log_format: str = "text"  # of the logs on stderr: "text" or "json" (one object a line)
    python_path: tuple[str, ...] = ()  # absolute folders put first on sys.path for the factories
    # Whether clients on this host may have payloads written into their memory (server/same_host)
    shared_memory: bool = True
    # Replies built lately, kept for requests with the same digest; None: 1/4 of the budget
    share_cache_bytes: int | None = None
    # The ports beside the ZeroMQ endpoint and the gRPC address whose plain sockets carry batch
    # replies to clients (server/zmq_data.py; 0: any free port); None: none, every reply goes
    # over ZeroMQ or gRPC
    zmq_data_port: int | None = 0
    grpc_data_port: int | None = 0

    def error(self, message: str) -> ConfigError:
        return ConfigError(f"{self.source}: {message}")


def load_config(
    path: str | Path,
    *,
    grpc: str | None = None,
    zmq: str | None = None,
    metrics: str | None = None,
    processes: int | None = None,
) -> WorkerConfig:
    """The config in `path`; `grpc`, `zmq`, `metrics` and `processes` (the CLI's overrides)
    replace the file's."""
    source = str(path)
    config = _parse(source, read_toml(path), grpc=grpc, zmq=zmq, metrics=metrics)
    if processes is None:
        return config
    if not is_int(processes, minimum=0):
        raise ConfigError(f"{source}: --processes must be an int >= 0, got {show(processes)}")
    return dataclasses.replace(config, processes=processes)


def build_pipelines(config: WorkerConfig) -> dict[str, Pipeline[Any, Any]]:
    """Import every factory and call it with its args."""
    return {pipeline.name: build_pipeline(config, pipeline) for pipeline in config.pipelines}


def build_pipeline(config: WorkerConfig, pipeline: PipelineConfig) -> Pipeline[Any, Any]:
    """Import `pipeline`'s factory and call it with its args (`loadax.factories`)."""
    return factories.build_pipeline(config.source, config.python_path, pipeline)


def load_factory(config: WorkerConfig, pipeline: PipelineConfig) -> Callable[..., Any]:
    """Import the callable that `pipeline.factory` ("module:function") names."""
    return factories.load_factory(config.source, config.python_path, pipeline)


def _parse(
    source: str,
    document: dict[str, Any],
    *,
    grpc: str | None,
    zmq: str | None,
    metrics: str | None,
) -> WorkerConfig:
    def fail(message: str) -> ConfigError:
        return ConfigError(f"{source}: {message}")

    check_keys(source, document, ("server", "pipelines"), "")
    server = document.get("server", {})
    if not isinstance(server, dict):
        raise fail(f"[server] must be a table, got {show(server)}")
    check_keys(source, server, _SERVER_KEYS, "[server].")

    grpc = listen_address(source, "--grpc", grpc) if grpc is not None else None
    zmq = zmq_endpoint(source, "--zmq", zmq) if zmq is not None else None
    if grpc is None and "grpc" in server:
        grpc = listen_address(source, "[server].grpc", server["grpc"])
    if zmq is None and "zmq" in server:
        zmq = zmq_endpoint(source, "[server].zmq", server["zmq"])
    metrics = listen_address(source, "--metrics", metrics) if metrics is not None else None
    if metrics is None and "metrics" in server:
        metrics = listen_address(source, "[server].metrics", server["metrics"])
    if grpc is None and zmq is None:
        raise fail("[server] needs grpc (a host:port) or zmq (a tcp://host:port), or both")

    pipelines = document.get("pipelines")
    if pipelines is None or pipelines == {}:
        raise fail("no pipelines: add at least one [pipelines.NAME] table with a factory")
    if not isinstance(pipelines, dict):
        raise fail(f"pipelines must be tables [pipelines.NAME], got {show(pipelines)}")
    base = Path(source).parent
    tls = curve = token = None
    if "tls" in server:
        if grpc is None:
            raise fail("[server.tls] secures gRPC, but [server] has no grpc address")
        tls = parse_tls(source, base, server["tls"])
    if "curve" in server:
        if zmq is None:
            raise fail("[server.curve] secures ZeroMQ, but [server] has no zmq endpoint")
        curve = parse_curve(source, base, server["curve"])
    if "token_file" in server:
        token = parse_token(source, base, server["token_file"])
    return WorkerConfig(
        source=source,
        pipelines=tuple(parse_pipeline(source, name, table) for name, table in pipelines.items()),
        grpc=grpc,
        zmq=zmq,
        metrics=metrics,
        threads=_positive_int(source, server, "threads", 4),
        processes=_int(source, server, "processes", 0, minimum=0),
        request_deadline_s=_seconds(source, server, "request_deadline_s", 60.0),
        max_in_flight_per_client=_positive_int(source, server, "max_in_flight_per_client", 16),
        memory_budget_bytes=(
            _positive_int(source, server, "memory_budget_mb", 1) << 20
            if "memory_budget_mb" in server
            else None
        ),
        tls=tls,
        curve=curve,
        token=token,
        log_format=_log_format(source, server),
        python_path=parse_python_path(source, base, server.get("python_path", [])),
        shared_memory=_flag(source, server, "shared_memory", True),
        share_cache_bytes=(
            _int(source, server, "share_cache_mb", 0, minimum=0) << 20
            if "share_cache_mb" in server
            else None
        ),
        zmq_data_port=_data_port(source, server, "zmq_data_port"),
        grpc_data_port=_data_port(source, server, "grpc_data_port"),
    )


def _log_format(source: str, server: Mapping[str, Any]) -> str:
    value = server.get("log_format", "text")
    if value not in LOG_FORMATS:
        raise ConfigError(
            f'{source}: [server].log_format must be "text" or "json", got {show(value)}'
        )
    return str(value)


def _data_port(source: str, server: Mapping[str, Any], key: str) -> int | None:
    value = server.get(key, 0)
    if value is False:
        return None
    if not is_int(value, minimum=0) or value > 65535:
        raise ConfigError(
            f"{source}: [server].{key} must be a port (0: any free one) or false, got {show(value)}"
        )
    return int(value)


def _positive_int(source: str, server: Mapping[str, Any], key: str, default: int) -> int:
    return _int(source, server, key, default, minimum=1)


def _int(source: str, server: Mapping[str, Any], key: str, default: int, *, minimum: int) -> int:
    value = server.get(key, default)
    if not is_int(value, minimum=minimum):
        raise ConfigError(
            f"{source}: [server].{key} must be an int >= {minimum}, got {show(value)}"
        )
    return int(value)


def _flag(source: str, server: Mapping[str, Any], key: str, default: bool) -> bool:
    value = server.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{source}: [server].{key} must be true or false, got {show(value)}")
    return value


def _seconds(source: str, server: Mapping[str, Any], key: str, default: float) -> float:
    value = server.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e9:
        raise ConfigError(
            f"{source}: [server].{key} must be a number of seconds > 0, got {show(value)}"
        )
    return float(value)
