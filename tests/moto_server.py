"""moto's S3 server in a process of its own on a loopback port, for the object store tests: `Moto`
checks every request's credentials; `SeededMoto` serves a directory's files from the moment it
listens, so that it can be killed and started again on the same port with the same objects."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import boto3  # type: ignore[import-untyped]
import pyarrow.fs as pafs  # type: ignore[import-untyped]
import pytest

BUCKET = "bucket"
# moto's server, ended when its stdin closes: when the test process ends, however it ends. Given
# a directory (argv[1], or "" for none), its files are the objects of BUCKET before it listens.
SERVER = """
import os, sys, threading
threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
if sys.argv[1]:
    from pathlib import Path
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends
    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    backend.create_bucket(sys.argv[2], "us-east-1")
    for path in sorted(Path(sys.argv[1]).rglob("*")):
        if path.is_file():
            key = path.relative_to(sys.argv[1]).as_posix()
            backend.put_object(sys.argv[2], key, path.read_bytes())
from moto.server import main
main(sys.argv[3:])
"""
READ_ALL = {  # an IAM policy that lets its user do anything with S3
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
}
ADMINISTER = {  # an IAM policy that lets its user do anything at all
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
}


class Moto:
    """A moto S3 server on a loopback port, with an empty bucket, that checks credentials:
    `key`/`secret` may read and write everything in S3; `stranger`'s key exists but has no
    policy; `admin`'s may do anything (change the others' policies)."""

    def __init__(self, directory: Path) -> None:
        self.log = (directory / "moto.log").open("w")
        self.process, self.port = started(self.log)
        self.endpoint = f"127.0.0.1:{self.port}"
        try:
            self._set_up()
        except BaseException:
            self.close()
            raise

    def _set_up(self) -> None:
        iam = self.iam()
        iam.create_user(UserName="reader")
        iam.put_user_policy(UserName="reader", PolicyName="s3", PolicyDocument=json.dumps(READ_ALL))
        reader = iam.create_access_key(UserName="reader")["AccessKey"]
        iam.create_user(UserName="stranger")
        stranger = iam.create_access_key(UserName="stranger")["AccessKey"]
        iam.create_user(UserName="admin")
        iam.put_user_policy(
            UserName="admin", PolicyName="all", PolicyDocument=json.dumps(ADMINISTER)
        )
        admin = iam.create_access_key(UserName="admin")["AccessKey"]
        self.key, self.secret = reader["AccessKeyId"], reader["SecretAccessKey"]
        self.stranger = stranger["AccessKeyId"], stranger["SecretAccessKey"]
        self.admin = admin["AccessKeyId"], admin["SecretAccessKey"]
        # From now on every request must be signed by a known key with a policy allowing it.
        request = urllib.request.Request(
            f"http://{self.endpoint}/moto-api/reset-auth",
            data=b"0",
            method="POST",
            headers={"Content-Type": "text/plain"},
        )
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert json.load(reply)["status"] == "ok"
        self.filesystem(allow_bucket_creation=True).create_dir(BUCKET)

    def iam(self, key: str = "setup", secret: str = "setup") -> Any:
        """A boto3 IAM client of the server, signing with `key` (before `reset-auth`, any)."""
        return boto3.client(
            "iam",
            endpoint_url=f"http://{self.endpoint}",
            aws_access_key_id=key,
            aws_secret_access_key=secret,
            region_name="us-east-1",
        )

    def filesystem(self, key: str | None = None, secret: str | None = None, **options: Any) -> Any:
        return pafs.S3FileSystem(
            access_key=key or self.key,
            secret_key=secret or self.secret,
            endpoint_override=self.endpoint,
            scheme="http",
            region="us-east-1",
            **options,
        )

    def environment(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Credentials and endpoint for URLs without a filesystem, as a user sets them."""
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", self.key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", self.secret)
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{self.endpoint}")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.log.close()


class SeededMoto:
    """A moto S3 server without credential checks whose BUCKET holds the files under `seed`
    (keys relative to it) from the moment it listens: `kill()` it (SIGKILL, as an outage does)
    and `start()` it again, on the same port, with the same objects."""

    def __init__(self, seed: Path, log: Path) -> None:
        self.seed = seed
        self.log = log.open("w")
        self.process: subprocess.Popen[bytes] | None = None
        self.process, self.port = started(self.log, seed=seed)
        self.endpoint = f"127.0.0.1:{self.port}"

    def filesystem(self, **options: Any) -> Any:
        return pafs.S3FileSystem(
            access_key="key",
            secret_key="secret",
            endpoint_override=self.endpoint,
            scheme="http",
            region="us-east-1",
            **options,
        )

    def kill(self) -> None:
        assert self.process is not None, "the server is not running"
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process = None

    def start(self) -> None:
        assert self.process is None, "the server is running"
        self.process, _ = started(self.log, self.port, self.seed)

    def close(self) -> None:
        if self.process is not None:
            self.kill()
        self.log.close()


def started(
    log: Any, port: int | None = None, seed: Path | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    """moto's server on loopback, answering, on `port` or a free port (a free port taken
    meanwhile by another process is retried on another); serving the files of `seed`."""
    for _ in range(1 if port else 3):
        chosen = port or _free_port()
        command = [sys.executable, "-c", SERVER, str(seed or ""), BUCKET]
        command += ["-H", "127.0.0.1", "-p", str(chosen)]
        process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 30
        while process.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"http://127.0.0.1:{chosen}/moto-api/", timeout=1).close()
                return process, chosen
            time.sleep(0.05)
        process.kill()
        process.wait()
    raise RuntimeError(f"moto did not start; see {log.name}")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
