"""The security tables of the worker's config: `[server.tls]` (gRPC), `[server.curve]` (ZeroMQ)
and `[server].token_file` (both), each checked before the worker listens."""

from __future__ import annotations

import dataclasses
import ssl
from pathlib import Path
from typing import Any, NoReturn

import zmq

from loadax.server.config_checks import ConfigError, check_keys, config_path, read_file, show
from loadax.wire.credentials import check_token, curve_key

_TLS_KEYS = ("cert", "key", "client_ca")
_CURVE_KEYS = ("secret_key_file", "allowed_clients")
MIN_TOKEN_CHARS = 16


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


def parse_tls(source: str, base: Path, table: Any) -> TlsConfig:
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: [server.tls] must be a table, got {show(table)}")
    check_keys(source, table, _TLS_KEYS, "[server.tls].")
    for required in ("cert", "key"):
        if required not in table:
            raise ConfigError(
                f"{source}: [server.tls].{required} is missing: name a PEM file "
                "(the worker's certificate chain as cert, its private key as key)"
            )
    cert_path = config_path(source, base, "[server.tls].cert", table["cert"])
    key_path = config_path(source, base, "[server.tls].key", table["key"])
    cert = read_file(source, "[server.tls].cert", cert_path)
    key = read_file(source, "[server.tls].key", key_path)
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
        path = config_path(source, base, "[server.tls].client_ca", table["client_ca"])
        client_ca = read_file(source, "[server.tls].client_ca", path)
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


def parse_curve(source: str, base: Path, table: Any) -> CurveConfig:
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: [server.curve] must be a table, got {show(table)}")
    check_keys(source, table, _CURVE_KEYS, "[server.curve].")
    if not zmq.has("curve"):
        raise ConfigError(f"{source}: [server.curve]: this libzmq was built without CURVE")
    key = "[server.curve].secret_key_file"
    if "secret_key_file" not in table:
        raise ConfigError(
            f"{source}: {key} is missing: name a file holding the worker's Z85 secret key"
        )
    path = config_path(source, base, key, table["secret_key_file"])
    public, secret = _curve_keypair(source, key, path, read_file(source, key, path))
    allowed = None
    if "allowed_clients" in table:
        keys = table["allowed_clients"]
        if not isinstance(keys, list) or not keys:
            raise ConfigError(
                f"{source}: [server.curve].allowed_clients must be a non-empty list of Z85 "
                f"client public keys (leave it out to admit any client that knows the worker's "
                f"public key), got {show(keys)}"
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


def parse_token(source: str, base: Path, value: Any) -> str:
    key = "[server].token_file"
    path = config_path(source, base, key, value)
    try:
        token = read_file(source, key, path).decode("ascii").strip()
        check_token(token)
    except (UnicodeDecodeError, ValueError) as error:
        raise ConfigError(f"{source}: {key}: {path}: not a usable token: {error}") from None
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(
            f"{source}: {key}: {path}: the token has {len(token)} characters, fewer than "
            f"{MIN_TOKEN_CHARS}; make one with `openssl rand -hex 32`"
        )
    return token
