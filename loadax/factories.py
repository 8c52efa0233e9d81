"""Pipelines built by the factories a worker config names: a `[pipelines.NAME]` table's
`factory = "module:function"` called with its `args`, imported from `[server] python_path` first.
A worker serves them (`loadax.server.config`); a client's local members build the same one
(`pipeline_from_config`). Every mistake is a `ConfigError` naming the file and the key."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import importlib
import json
import re
import sys
import tomllib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from loadax.execution.pipeline import Pipeline

PIPELINE_KEYS = ("factory", "args")
_FACTORY = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


class ConfigError(ValueError):
    """A worker config that cannot be used; the message names the file and the key."""


def check_keys(source: str, table: Mapping[str, Any], known: tuple[str, ...], prefix: str) -> None:
    """Typos must not pass unnoticed: every key of `table` must be one of `known`."""
    for key in table:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"{source}: unknown key {prefix}{key}{hint}; expected one of: {', '.join(known)}"
            )


def show(value: Any) -> str:
    """A config value as TOML-ish text: strings in double quotes."""
    return json.dumps(value, default=repr)


def show_name(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name)


@dataclasses.dataclass(frozen=True, slots=True)
class PipelineConfig:
    """One `[pipelines.NAME]` table: `factory(**args)` returns the `loadax.Pipeline`."""

    name: str
    factory: str
    args: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"[pipelines.{show_name(self.name)}]"


def read_toml(path: str | Path) -> dict[str, Any]:
    """The TOML document in `path`: a `ConfigError` when it cannot be read or parsed."""
    try:
        text = Path(path).read_bytes().decode()
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) else str(error)
        raise ConfigError(f"{path}: cannot read the config: {reason}") from error
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: invalid TOML: {error}") from error


def parse_pipeline(source: str, name: str, table: Any) -> PipelineConfig:
    """Table `[pipelines.NAME]` of the config `source`, checked."""
    key = f"[pipelines.{show_name(name)}]"
    if not name:
        raise ConfigError(f"{source}: {key}: a pipeline name must not be empty")
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: {key} must be a table, got {show(table)}")
    check_keys(source, table, PIPELINE_KEYS, f"{key}.")
    factory = table.get("factory")
    if factory is None:
        raise ConfigError(f"{source}: {key}.factory is missing: name a module:function")
    if not isinstance(factory, str) or not _FACTORY.match(factory):
        raise ConfigError(
            f'{source}: {key}.factory must be "module:function" '
            f'(e.g. "my_project.data:images"), got {show(factory)}'
        )
    args = table.get("args", {})
    if not isinstance(args, dict):
        raise ConfigError(f"{source}: {key}.args must be a table, got {show(args)}")
    return PipelineConfig(name=name, factory=factory, args=args)


def parse_python_path(source: str, base: Path, value: Any) -> tuple[str, ...]:
    """The folders of `[server].python_path`, absolute; relative ones are from the config's."""
    where = f"{source}: [server].python_path"
    if not isinstance(value, list) or not all(isinstance(entry, str) and entry for entry in value):
        raise ConfigError(
            f'{where} must be a list of folders (e.g. ["src", "../lib"]), got {show(value)}'
        )
    folders = []
    for entry in value:
        folder = (base / entry).resolve()
        if not folder.is_dir():
            reason = "does not exist" if not folder.exists() else "is not a folder"
            raise ConfigError(
                f"{where}: {entry!r} {reason} ({folder}; relative paths start at the "
                "config's folder)"
            )
        folders.append(str(folder))
    return tuple(folders)


def load_factory(
    source: str, python_path: tuple[str, ...], pipeline: PipelineConfig
) -> Callable[..., Any]:
    """Import the callable that `pipeline.factory` ("module:function") of the config `source`
    names, from `python_path` first."""
    key = f"{pipeline.key}.factory"
    module_name, _, attributes = pipeline.factory.partition(":")
    _put_first_on_sys_path(python_path)
    try:
        with _own_argv():
            target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is not None and f"{module_name}.".startswith(f"{error.name}."):
            raise ConfigError(
                f"{source}: {key}: module {module_name!r} is not importable: {error}; "
                f"{_where_modules_come_from(python_path)}"
            ) from error
        raise ConfigError(
            f"{source}: {key}: importing module {module_name!r} failed: {error!r}"
        ) from error
    except (Exception, SystemExit, KeyboardInterrupt) as error:
        raise ConfigError(
            f"{source}: {key}: importing module {module_name!r} failed: {_stopped(error)}"
        ) from error
    for attribute in attributes.split("."):
        if not hasattr(target, attribute):
            raise ConfigError(
                f"{source}: {key}: {getattr(target, '__name__', module_name)!r} has no attribute "
                f"{attribute!r} (factory {pipeline.factory!r})"
            )
        target = getattr(target, attribute)
    if not callable(target):
        raise ConfigError(
            f"{source}: {key}: {pipeline.factory!r} is a {type(target).__name__}, not a callable"
        )
    factory: Callable[..., Any] = target
    return factory


def _put_first_on_sys_path(folders: tuple[str, ...]) -> None:
    """`[server] python_path` ahead of the rest of sys.path. Child processes get the parent's
    sys.path with the rest of multiprocessing's preparation data, before they unpickle the
    pipeline they rebuild, so they import the factories from the same folders."""
    missing = [folder for folder in folders if folder not in sys.path]
    if missing:
        sys.path[:0] = missing
        importlib.invalidate_caches()


def _where_modules_come_from(python_path: tuple[str, ...]) -> str:
    if python_path:
        return f"it is neither installed nor in [server] python_path ({', '.join(python_path)})"
    return (
        "install it, or list the folder that holds it in [server] python_path (relative to "
        'the config\'s folder, e.g. python_path = ["src"])'
    )


@contextlib.contextmanager
def _own_argv() -> Iterator[None]:
    """The user's code runs as if started with no arguments: a module that parses the command
    line at import sees none of the worker's."""
    saved = sys.argv
    sys.argv = saved[:1]
    try:
        yield
    finally:
        sys.argv = saved


def _stopped(error: BaseException) -> str:
    """What stopped the user's code, for a config error."""
    if isinstance(error, SystemExit):
        return f"it called sys.exit({error.code!r}) (SystemExit)"
    if isinstance(error, KeyboardInterrupt):
        return "KeyboardInterrupt"
    return f"{type(error).__name__}: {error}"


def build_pipeline(
    source: str, python_path: tuple[str, ...], pipeline: PipelineConfig
) -> Pipeline[Any, Any]:
    """Import `pipeline`'s factory (see `load_factory`) and call it with its args."""
    factory = load_factory(source, python_path, pipeline)
    try:
        with _own_argv():
            built = factory(**pipeline.args)
    except (Exception, SystemExit, KeyboardInterrupt) as error:
        raise ConfigError(
            f"{source}: {pipeline.key}.factory: {pipeline.factory}"
            f"(**{show(dict(pipeline.args))}) raised {_stopped(error)}"
        ) from error
    if not isinstance(built, Pipeline):
        raise ConfigError(
            f"{source}: {pipeline.key}.factory: {pipeline.factory} must return a "
            f"loadax.Pipeline, got {type(built).__name__}: {built!r:.80}"
        )
    return built


@dataclasses.dataclass(frozen=True, slots=True)
class Rebuild:
    """A pipeline as child processes get it: unpickled, it is built again by calling its factory,
    as the worker did, so that the lambdas and closures in it need no pickling."""

    source: str
    pipeline: PipelineConfig

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuilt, (self.source, self.pipeline)


def _rebuilt(source: str, pipeline: PipelineConfig) -> Pipeline[Any, Any]:
    # The parent's sys.path comes with the child's preparation: python_path is on it already.
    return build_pipeline(source, (), pipeline)


def pipeline_from_config(path: str | Path, name: str) -> tuple[Pipeline[Any, Any], Rebuild]:
    """Pipeline `name` of the worker config at `path`, built as the worker builds it, and how
    child processes build it again; the rest of the config is the worker's to check."""
    source = str(path)
    document = read_toml(path)
    server, pipelines = document.get("server", {}), document.get("pipelines", {})
    if not isinstance(server, dict):
        raise ConfigError(f"{source}: [server] must be a table, got {show(server)}")
    if not isinstance(pipelines, dict) or name not in pipelines:
        named = sorted(pipelines) if isinstance(pipelines, dict) else []
        raise ConfigError(
            f"{source}: no [pipelines.{show_name(name)}] table; the config names {named}"
        )
    python_path = parse_python_path(source, Path(source).parent, server.get("python_path", []))
    pipeline = parse_pipeline(source, name, pipelines[name])
    return build_pipeline(source, python_path, pipeline), Rebuild(source, pipeline)
