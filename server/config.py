"""The worker's TOML config: listen addresses, limits, and the pipeline factories it serves.

Every mistake is a `ConfigError` naming the file and the key, found before the worker listens.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import json
import re
import ssl
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

import zmq

from loadax.execution.pipeline import Pipeline
from loadax.validation import is_int
from loadax.wire.credentials import check_token, curve_key

_SERVER_KEYS = (
    "grpc",
    "zmq",
    "metrics",
    "threads",
    "max_in_flight_per_client",
    "memory_budget_mb",
    "token_file",
    "tls",
    "curve",
)
_TLS_KEYS = ("cert", "key", "client_ca")
_CURVE_KEYS = ("secret_key_file", "allowed_clients")
MIN_TOKEN_CHARS = 16
_PIPELINE_KEYS = ("factory", "args")
_FACTORY = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)$")


class ConfigError(ValueError):
    """A worker config that cannot be used; the message names the file and the key."""


@dataclasses.dataclass(frozen=True, slots=True)
class PipelineConfig:
    """One `[pipelines.NAME]` table: `factory(**args)` returns the `loadax.Pipeline`."""

    name: str
    factory: str
    args: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"[pipelines.{_show_name(self.name)}]"


@dataclasses.dataclass(frozen=True, slots=True)
class TlsConfig:
    """`[server.tls]`, as PEM: the worker's certificate chain and key, and the CA that clients'
    certificates must be signed by (mutual TLS) or None (any client may connect)."""

    cert_chain: bytes
    private_key: bytes = dataclasses.field(repr=False)
    client_ca: bytes | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class CurveConfig:
    """`[server.curve]`: the worker's CURVE keypair (Z85) and the client public keys it admits
    (None: any client that knows the worker's public key)."""

    public_key: bytes
    secret_key: bytes = dataclasses.field(repr=False)
    allowed_clients: frozenset[bytes] | None = None


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
    max_in_flight_per_client: int = 16
    memory_budget_bytes: int | None = None  # batches being built and encoded, at most
    tls: TlsConfig | None = None
    curve: CurveConfig | None = None
    token: str | None = dataclasses.field(default=None, repr=False)

    def error(self, message: str) -> ConfigError:
        return ConfigError(f"{self.source}: {message}")


def load_config(
    path: str | Path,
    *,
    grpc: str | None = None,
    zmq: str | None = None,
    metrics: str | None = None,
) -> WorkerConfig:
    """The config in `path`; `grpc`, `zmq` and `metrics` (the CLI's overrides) replace the
    file's."""
    source = str(path)
    try:
        text = Path(path).read_bytes().decode()
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) else str(error)
        raise ConfigError(f"{source}: cannot read the config: {reason}") from error
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{source}: invalid TOML: {error}") from error
    return _parse(source, document, grpc=grpc, zmq=zmq, metrics=metrics)


def load_factory(config: WorkerConfig, pipeline: PipelineConfig) -> Callable[..., Any]:
    """Import the callable that `pipeline.factory` ("module:function") names."""
    key = f"{pipeline.key}.factory"
    module_name, _, attributes = pipeline.factory.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is not None and f"{module_name}.".startswith(f"{error.name}."):
            raise config.error(
                f"{key}: module {module_name!r} is not importable: {error}"
            ) from error
        raise config.error(f"{key}: importing module {module_name!r} failed: {error!r}") from error
    except Exception as error:
        raise config.error(f"{key}: importing module {module_name!r} failed: {error!r}") from error
    for attribute in attributes.split("."):
        if not hasattr(target, attribute):
            raise config.error(
                f"{key}: {getattr(target, '__name__', module_name)!r} has no attribute "
                f"{attribute!r} (factory {pipeline.factory!r})"
            )
        target = getattr(target, attribute)
    if not callable(target):
        raise config.error(
            f"{key}: {pipeline.factory!r} is a {type(target).__name__}, not a callable"
        )
    factory: Callable[..., Any] = target
    return factory


def build_pipelines(config: WorkerConfig) -> dict[str, Pipeline[Any, Any]]:
    """Import every factory and call it with its args."""
    pipelines: dict[str, Pipeline[Any, Any]] = {}
    for pipeline in config.pipelines:
        factory = load_factory(config, pipeline)
        try:
            built = factory(**pipeline.args)
        except Exception as error:
            raise config.error(
                f"{pipeline.key}.factory: {pipeline.factory}(**{_show(dict(pipeline.args))}) "
                f"raised {type(error).__name__}: {error}"
            ) from error
        if not isinstance(built, Pipeline):
            raise config.error(
                f"{pipeline.key}.factory: {pipeline.factory} must return a loadax.Pipeline, "
                f"got {type(built).__name__}: {built!r:.80}"
            )
        pipelines[pipeline.name] = built
    return pipelines


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

    _check_keys(source, document, ("server", "pipelines"), "")
    server = document.get("server", {})
    if not isinstance(server, dict):
        raise fail(f"[server] must be a table, got {_show(server)}")
    _check_keys(source, server, _SERVER_KEYS, "[server].")

    grpc = _address(source, "--grpc", grpc) if grpc is not None else None
    zmq = _zmq_endpoint(source, "--zmq", zmq) if zmq is not None else None
    if grpc is None and "grpc" in server:
        grpc = _address(source, "[server].grpc", server["grpc"])
    if zmq is None and "zmq" in server:
        zmq = _zmq_endpoint(source, "[server].zmq", server["zmq"])
    metrics = _address(source, "--metrics", metrics) if metrics is not None else None
    if metrics is None and "metrics" in server:
        metrics = _address(source, "[server].metrics", server["metrics"])
    if grpc is None and zmq is None:
        raise fail("[server] needs grpc (a host:port) or zmq (a tcp://host:port), or both")

    pipelines = document.get("pipelines")
    if pipelines is None or pipelines == {}:
        raise fail("no pipelines: add at least one [pipelines.NAME] table with a factory")
    if not isinstance(pipelines, dict):
        raise fail(f"pipelines must be tables [pipelines.NAME], got {_show(pipelines)}")
    base = Path(source).parent
    tls = curve = token = None
    if "tls" in server:
        if grpc is None:
            raise fail("[server.tls] secures gRPC, but [server] has no grpc address")
        tls = _tls(source, base, server["tls"])
    if "curve" in server:
        if zmq is None:
            raise fail("[server.curve] secures ZeroMQ, but [server] has no zmq endpoint")
        curve = _curve(source, base, server["curve"])
    if "token_file" in server:
        token = _token(source, base, server["token_file"])
    return WorkerConfig(
        source=source,
        pipelines=tuple(_pipeline(source, name, table) for name, table in pipelines.items()),
        grpc=grpc,
        zmq=zmq,
        metrics=metrics,
        threads=_positive_int(source, server, "threads", 4),
        max_in_flight_per_client=_positive_int(source, server, "max_in_flight_per_client", 16),
        memory_budget_bytes=(
            _positive_int(source, server, "memory_budget_mb", 1) << 20
            if "memory_budget_mb" in server
            else None
        ),
        tls=tls,
        curve=curve,
        token=token,
    )


def _tls(source: str, base: Path, table: Any) -> TlsConfig:
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: [server.tls] must be a table, got {_show(table)}")
    _check_keys(source, table, _TLS_KEYS, "[server.tls].")
    for required in ("cert", "key"):
        if required not in table:
            raise ConfigError(
                f"{source}: [server.tls].{required} is missing: name a PEM file "
                "(the worker's certificate chain as cert, its private key as key)"
            )
    cert_path = _path(source, base, "[server.tls].cert", table["cert"])
    key_path = _path(source, base, "[server.tls].key", table["key"])
    cert = _read(source, "[server.tls].cert", cert_path)
    key = _read(source, "[server.tls].key", key_path)
    _certificates(source, "[server.tls].cert", cert)

    def encrypted() -> NoReturn:
        raise ConfigError(
            f"{source}: [server.tls].key: {key_path} is encrypted; gRPC needs an unencrypted key"
        )

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert_path, key_path, password=encrypted)
    except (ssl.SSLError, ValueError) as error:
        raise ConfigError(
            f"{source}: [server.tls].key: {key_path} is not a PEM private key that matches "
            f"[server.tls].cert: {error}"
        ) from None
    client_ca = None
    if "client_ca" in table:
        path = _path(source, base, "[server.tls].client_ca", table["client_ca"])
        client_ca = _read(source, "[server.tls].client_ca", path)
        _certificates(source, "[server.tls].client_ca", client_ca)
    return TlsConfig(cert_chain=cert, private_key=key, client_ca=client_ca)


def _certificates(source: str, key: str, pem: bytes) -> None:
    """Refuses `pem` unless it holds PEM certificates, and nothing but valid ones."""
    try:
        text = pem.decode("ascii")
        if "-----BEGIN CERTIFICATE-----" not in text:
            raise ValueError("no PEM certificate (-----BEGIN CERTIFICATE-----) in it")
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=text)
    except (UnicodeDecodeError, ValueError, ssl.SSLError) as error:
        raise ConfigError(f"{source}: {key}: not a PEM certificate file: {error}") from None


def _curve(source: str, base: Path, table: Any) -> CurveConfig:
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: [server.curve] must be a table, got {_show(table)}")
    _check_keys(source, table, _CURVE_KEYS, "[server.curve].")
    if not zmq.has("curve"):
        raise ConfigError(f"{source}: [server.curve]: this libzmq was built without CURVE")
    key = "[server.curve].secret_key_file"
    if "secret_key_file" not in table:
        raise ConfigError(
            f"{source}: {key} is missing: name a file holding the worker's Z85 secret key"
        )
    path = _path(source, base, key, table["secret_key_file"])
    public, secret = _curve_keypair(source, key, path, _read(source, key, path))
    allowed = None
    if "allowed_clients" in table:
        keys = table["allowed_clients"]
        if not isinstance(keys, list) or not keys:
            raise ConfigError(
                f"{source}: [server.curve].allowed_clients must be a non-empty list of Z85 "
                f"client public keys (leave it out to admit any client that knows the worker's "
                f"public key), got {_show(keys)}"
            )
        checked = []
        for index, value in enumerate(keys):
            try:
                checked.append(curve_key(value))
            except ValueError as error:
                raise ConfigError(
                    f"{source}: [server.curve].allowed_clients[{index}]: {error}"
                ) from None
        allowed = frozenset(checked)
    return CurveConfig(public_key=public, secret_key=secret, allowed_clients=allowed)


def _curve_keypair(source: str, key: str, path: Path, content: bytes) -> tuple[bytes, bytes]:
    """(public, secret) from a file that holds a Z85 secret key alone, or a ZeroMQ certificate
    with a `secret-key` line (as `zmq.auth.create_certificates` writes)."""
    try:
        text = content.decode("ascii").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"{source}: {key}: {path} is not ASCII text") from None
    fields: dict[str, str] = {}
    if text and len(text.split()) == 1:
        fields["secret-key"] = text
    for line in text.splitlines():
        name, separator, value = line.strip().partition("=")
        if separator and name.strip() in ("public-key", "secret-key"):
            fields[name.strip()] = value.strip().strip("\"'")
    if "secret-key" not in fields:
        raise ConfigError(
            f"{source}: {key}: {path} holds no secret key: write the Z85 secret key alone, or "
            'a ZeroMQ certificate with secret-key = "..."'
        )
    try:
        secret = curve_key(fields["secret-key"])
    except ValueError as error:
        raise ConfigError(f"{source}: {key}: {path}: the secret key {error}") from None
    public = zmq.curve_public(secret)
    if "public-key" in fields and fields["public-key"].encode() != public:
        raise ConfigError(
            f"{source}: {key}: {path}: its public-key does not belong to its secret-key"
        )
    return public, secret


def _token(source: str, base: Path, value: Any) -> str:
    key = "[server].token_file"
    path = _path(source, base, key, value)
    try:
        token = _read(source, key, path).decode("ascii").strip()
        check_token(token)
    except (UnicodeDecodeError, ValueError) as error:
        raise ConfigError(f"{source}: {key}: {path}: not a usable token: {error}") from None
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(
            f"{source}: {key}: {path}: the token has {len(token)} characters, fewer than "
            f"{MIN_TOKEN_CHARS}; make one with `openssl rand -hex 32`"
        )
    return token


def _path(source: str, base: Path, key: str, value: Any) -> Path:
    """A file path from the config: relative ones are relative to the config file."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{source}: {key} must be a file path, got {_show(value)}")
    return base / Path(value).expanduser()


def _read(source: str, key: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise ConfigError(f"{source}: {key}: cannot read {path}: {error.strerror}") from None


def _pipeline(source: str, name: str, table: Any) -> PipelineConfig:
    key = f"[pipelines.{_show_name(name)}]"
    if not name:
        raise ConfigError(f"{source}: {key}: a pipeline name must not be empty")
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: {key} must be a table, got {_show(table)}")
    _check_keys(source, table, _PIPELINE_KEYS, f"{key}.")
    factory = table.get("factory")
    if factory is None:
        raise ConfigError(f"{source}: {key}.factory is missing: name a module:function")
    if not isinstance(factory, str) or not _FACTORY.match(factory):
        raise ConfigError(
            f'{source}: {key}.factory must be "module:function" '
            f'(e.g. "my_project.data:images"), got {_show(factory)}'
        )
    args = table.get("args", {})
    if not isinstance(args, dict):
        raise ConfigError(f"{source}: {key}.args must be a table, got {_show(args)}")
    return PipelineConfig(name=name, factory=factory, args=args)


def _check_keys(source: str, table: Mapping[str, Any], known: tuple[str, ...], prefix: str) -> None:
    """Typos must not pass unnoticed: every key of `table` must be one of `known`."""
    for key in table:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"{source}: unknown key {prefix}{key}{hint}; expected one of: {', '.join(known)}"
            )


def _positive_int(source: str, server: Mapping[str, Any], key: str, default: int) -> int:
    value = server.get(key, default)
    if not is_int(value, minimum=1):
        raise ConfigError(f"{source}: [server].{key} must be an int >= 1, got {_show(value)}")
    return int(value)


def _address(source: str, key: str, value: Any) -> str:
    """A "host:port" (gRPC's, the metrics exporter's)."""
    if not isinstance(value, str) or not _host_port(value):
        raise ConfigError(
            f'{source}: {key} must be "host:port" (port 0: any free port), got {_show(value)}'
        )
    return value


def _zmq_endpoint(source: str, key: str, value: Any) -> str:
    if (
        isinstance(value, str)
        and value.startswith("tcp://")
        and _host_port(value.removeprefix("tcp://"), wildcard=True)
    ):
        return value
    raise ConfigError(
        f'{source}: {key} must be "tcp://host:port" (port 0: any free port), got {_show(value)}'
    )


def _host_port(address: str, *, wildcard: bool = False) -> bool:
    host, separator, port = address.rpartition(":")
    return (
        bool(separator)
        and (bool(_HOST.match(host)) or (wildcard and host == "*"))
        and port.isdigit()
        and port.isascii()
        and int(port) <= 65535
    )


def _show(value: Any) -> str:
    """A config value as TOML-ish text: strings in double quotes."""
    return json.dumps(value, default=repr)


def _show_name(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name)
