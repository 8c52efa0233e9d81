"""Which systems run on which workload, in which environment, and what they are to loadax.

A system's name is the key its runner script maps to code (`SYSTEMS` in the script).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import fleet

Role = Literal["loadax", "peer", "reference"]
"""loadax: a configuration under test; peer: another library it is compared with (ratios);
reference: a yardstick measured in the same rounds (local mode, raw sockets, memcpy)."""

PEERS_ENV = "peers"
LOADAX021_ENV = "loadax021"
TORCH, TENSORFLOW, GRAIN, LOADAX021 = "torch==2.13.0", "tensorflow-cpu", "grain", "loadax==0.2.1"
ENVIRONMENTS: dict[str, tuple[str, ...]] = {
    PEERS_ENV: ("numpy", GRAIN, TORCH, TENSORFLOW),
    LOADAX021_ENV: (LOADAX021,),
}
"""The virtualenvs under .bench/ that the peers run in, and what pip installs into each."""

LOADAX_WORKERS = "loadax-worker x2"
TF_SERVICE_1, TF_SERVICE_2 = "tf.data service (1 worker)", "tf.data service (2 workers)"


@dataclasses.dataclass(frozen=True, slots=True)
class System:
    """One configuration of one library; `package` is the requirement it needs in `env`
    (None: loadax's own .venv) and `service` the servers the driver starts for it."""

    name: str
    script: str
    role: Role = "peer"
    env: str | None = None
    package: str | None = None
    service: str | None = None


def _loadax(name: str, service: str | None = None, role: Role = "loadax") -> System:
    return System(name, "loadax_runner.py", role, service=service)


def _peer(name: str, script: str, package: str, service: str | None = None) -> System:
    env = LOADAX021_ENV if package == LOADAX021 else PEERS_ENV
    return System(name, script, "peer", env, package, service)


_TF_DATA = _peer("tf.data", "peer_tfdata.py", TENSORFLOW)
_T1_SYSTEMS = (
    # On loopback the workers write batches into the client's memory (the same-host fast path);
    # "sockets" turns it off, as for workers on other hosts.
    _loadax("loadax gRPC", LOADAX_WORKERS),
    _loadax("loadax ZeroMQ", LOADAX_WORKERS),
    _loadax("loadax gRPC sockets", LOADAX_WORKERS),
    _loadax("loadax ZeroMQ sockets", LOADAX_WORKERS),
    System("raw TCP", "transport_runner.py", "reference"),
    System("ZeroMQ PUSH/PULL", "transport_runner.py", "reference"),
    System("gRPC raw bytes", "transport_runner.py", "reference"),
)
_LOCAL_SYSTEMS = (
    _loadax("loadax 0w"),
    _loadax("loadax 2w"),
    _peer("torch 0w", "peer_torch.py", TORCH),
    _peer("torch 2w", "peer_torch.py", TORCH),
    _TF_DATA,
    _peer("grain Dataset", "peer_grain.py", GRAIN),
    _peer("grain Dataset mp_prefetch(2)", "peer_grain.py", GRAIN),
    _peer("grain DataLoader", "peer_grain.py", GRAIN),
    _peer("loadax 0.2.1", "peer_loadax021.py", LOADAX021),
)

CATALOG: dict[str, tuple[System, ...]] = {
    "W1": _LOCAL_SYSTEMS,
    "W2": _LOCAL_SYSTEMS,
    "W3": _LOCAL_SYSTEMS,
    "R1": (
        _loadax("loadax gRPC 1w", LOADAX_WORKERS),
        _loadax("loadax gRPC 2w", LOADAX_WORKERS),
        _loadax("loadax ZeroMQ 1w", LOADAX_WORKERS),
        _loadax("loadax ZeroMQ 2w", LOADAX_WORKERS),
        _loadax("loadax 2w", role="reference"),
        dataclasses.replace(_TF_DATA, role="reference"),
        _peer("tf.data service 1w", "peer_tfdata.py", TENSORFLOW, TF_SERVICE_1),
        _peer("tf.data service 2w", "peer_tfdata.py", TENSORFLOW, TF_SERVICE_2),
    ),
    "T1": _T1_SYSTEMS,
    "T1-64M": _T1_SYSTEMS,
    "codec": (
        System("loadax.wire.codec encode_frames", "codec_runner.py", "loadax"),
        System("loadax.wire.codec encode", "codec_runner.py", "loadax"),
        System("loadax.wire.codec decode", "codec_runner.py", "loadax"),
        System("memcpy", "codec_runner.py", "reference"),
    ),
    "P1": (
        System("Plan.indices batch 1048576", "p1_runner.py", "loadax"),
        System("Plan.indices batch 4096", "p1_runner.py", "loadax"),
    ),
    "R2": tuple(
        System(run.name, "fleet_runner.py", "loadax", service=run.service) for run in fleet.RUNS
    ),
}

UNITS = {
    "W1": "elem/s",
    "W2": "img/s",
    "W3": "elem/s",
    "R1": "img/s",
    "T1": "GB/s",
    "T1-64M": "GB/s",
    "codec": "GB/s",
    "P1": "indices/s",
    "R2": "records/s",
}
"""What each workload's headline rate counts: elements, or bytes for T1 and the codec."""
TITLES = {
    "W1": "W1 overhead: {records:,} ints, identity, batch {batch_size}",
    "W2": "W2 images: {records:,} uint8 256x256x3, random 224 crop + flip + normalise, "
    "batch {batch_size}",
    "W3": "W3 CPU-heavy: {records:,} float32 512x512, abs(fft2) cut to 256x256, batch {batch_size}",
    "R1": "R1 remote: W2 ({records:,} images, batch {batch_size}) from loadax-workers on loopback",
    "T1": "T1 transport: {records} pre-built 8 MiB batches, worker to client",
    "T1-64M": "T1 transport: {records} pre-built 64 MiB batches, worker to client",
    "codec": "codec: a W2 batch ({batch_size} x 224x224x3 float32 + labels), {records} times",
    "P1": "P1 planner: shuffled Plan over {records:,} records",
    "R2": "R2 fleet: {records:,} records of 1 KiB, each a sleep of 5 or 20 ms, batch {batch_size}, "
    f"from loadax-workers ({fleet.THREADS} threads each) on loopback, default client settings",
}
"""Each workload's heading in RESULTS.md, filled in with its records and batch size."""


def select(workloads: list[str], names: list[str] | None) -> dict[str, tuple[System, ...]]:
    """The systems of `workloads`, only those named in `names` when it is given."""
    unknown = [name for name in workloads if name not in CATALOG]
    if unknown:
        raise ValueError(f"unknown workloads {unknown}: expected some of {', '.join(CATALOG)}")
    known = {system.name for systems in CATALOG.values() for system in systems}
    if names is not None and set(names) - known:
        raise ValueError(
            f"unknown systems {sorted(set(names) - known)}: expected some of {sorted(known)}"
        )
    chosen = {
        workload: tuple(s for s in CATALOG[workload] if names is None or s.name in names)
        for workload in workloads
    }
    chosen = {workload: systems for workload, systems in chosen.items() if systems}
    if not chosen:
        raise ValueError(f"no system of the workloads {workloads} is among {names}")
    return chosen
