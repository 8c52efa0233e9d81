"""`ClientSecurity`: how a client proves itself to workers and checks that they are the right ones.

TLS (gRPC) is on when `ca_cert` is set, CURVE (ZeroMQ) when `curve_server_key` is set; the token
goes with every request on either transport. See SECURITY.md for what each protects.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import zmq

from loadax.wire.credentials import check_token, curve_key


@dataclasses.dataclass(frozen=True, slots=True)
class ClientSecurity:
    """Client credentials; every field is optional, and paths are PEM files.

    - `ca_cert`: the CA that gRPC workers' certificates must chain to; turns TLS on.
    - `client_cert`, `client_key`: this client's certificate and key, for workers that require
      mutual TLS; both or neither, and only with `ca_cert`.
    - `tls_server_name`: the name to check the workers' certificates against, when it is not
      the host of the address (e.g. connecting by IP to a certificate for a DNS name).
    - `token`: the shared token the workers require, sent with every request.
    - `curve_server_key`: the workers' Z85 CURVE public key; turns CURVE on for ZeroMQ.
    - `curve_client_keypair`: this client's (public, secret) Z85 keys, for workers with an
      allow-list; without it each connection uses a fresh keypair.

    >>> from loadax.client import ClientSecurity
    >>> security = ClientSecurity(token="s3cret-token")
    >>> security.tls, security.curve, "s3cret" in repr(security)
    (False, False, False)
    >>> ClientSecurity(tls_server_name="workers.internal")
    Traceback (most recent call last):
    ...
    ValueError: tls_server_name: needs ca_cert too (TLS is off without it)
    """

    ca_cert: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None
    tls_server_name: str | None = None
    token: str | None = dataclasses.field(default=None, repr=False)
    curve_server_key: str | None = None
    curve_client_keypair: tuple[str, str] | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self) -> None:
        for name in ("ca_cert", "client_cert", "client_key"):
            value = getattr(self, name)
            if isinstance(value, str):
                value = Path(value)
                object.__setattr__(self, name, value)
            if value is not None:
                _check_pem(name, value)
        if (self.client_cert is None) != (self.client_key is None):
            raise ValueError("client_cert and client_key: give both (mutual TLS) or neither")
        if self.client_cert is not None and self.ca_cert is None:
            raise ValueError("client_cert: mutual TLS needs ca_cert too, to verify the workers")
        if self.tls_server_name is not None:
            if not isinstance(self.tls_server_name, str) or not self.tls_server_name:
                raise ValueError(
                    f"tls_server_name must be a host name, got {self.tls_server_name!r}"
                )
            if self.ca_cert is None:
                raise ValueError("tls_server_name: needs ca_cert too (TLS is off without it)")
        if self.token is not None:
            try:
                check_token(self.token)
            except ValueError as error:
                raise ValueError(f"token: {error}") from None
        if self.curve_server_key is not None:
            _check_curve("curve_server_key", self.curve_server_key)
        if self.curve_client_keypair is not None:
            self._check_keypair(self.curve_client_keypair)

    @property
    def tls(self) -> bool:
        """Whether gRPC connections use TLS."""
        return self.ca_cert is not None

    @property
    def curve(self) -> bool:
        """Whether ZeroMQ connections use CURVE."""
        return self.curve_server_key is not None

    def _check_keypair(self, keypair: object) -> None:
        if self.curve_server_key is None:
            raise ValueError("curve_client_keypair: needs curve_server_key too")
        if not isinstance(keypair, tuple) or len(keypair) != 2:
            raise ValueError("curve_client_keypair must be a (public, secret) pair of Z85 keys")
        public, secret = keypair
        _check_curve("curve_client_keypair[0] (public)", public)
        _check_curve("curve_client_keypair[1] (secret)", secret)
        if zmq.curve_public(secret.encode("ascii")) != public.encode("ascii"):
            raise ValueError("curve_client_keypair: the public key does not belong to the secret")


def _check_pem(name: str, path: Path) -> None:
    if not isinstance(path, Path):
        raise ValueError(f"{name} must be a path, got {type(path).__name__}")
    try:
        content = path.read_bytes()
    except OSError as error:
        raise ValueError(f"{name}: cannot read {path}: {error.strerror}") from None
    if b"-----BEGIN " not in content:
        raise ValueError(f"{name}: {path} is not a PEM file (no -----BEGIN line)")


def _check_curve(name: str, key: object) -> None:
    if not zmq.has("curve"):
        raise ValueError(f"{name}: this libzmq was built without CURVE")
    try:
        curve_key(key)
    except ValueError as error:
        raise ValueError(f"{name} {error}") from None
