"""Plans and versions on the wire, shared by the worker and the client."""

from __future__ import annotations

from loadax.errors import WorkerError
from loadax.plan import Plan
from loadax.wire.v1 import worker_pb2 as wire


def compatible_versions(client: str, worker: str) -> bool:
    """Client and worker must agree on the major and minor version."""
    return client.split(".")[:2] == worker.split(".")[:2]


def plan_to_wire(plan: Plan) -> wire.Plan:
    message = wire.Plan(
        num_records=plan.num_records,
        batch_size=plan.batch_size,
        seed=plan.seed,
        shuffle=plan.shuffle,
        drop_remainder=plan.drop_remainder,
    )
    if plan.num_epochs is not None:
        message.num_epochs = plan.num_epochs
    return message


def plan_from_wire(message: wire.Plan, num_records: int | None = None) -> Plan:
    """The plan of a request; `num_records` overrides the message's (handshakes leave it 0)."""
    try:
        return Plan(
            num_records=message.num_records if num_records is None else num_records,
            batch_size=message.batch_size,
            seed=message.seed,
            shuffle=message.shuffle,
            num_epochs=message.num_epochs if message.HasField("num_epochs") else None,
            drop_remainder=message.drop_remainder,
        )
    except ValueError as error:
        raise WorkerError("INVALID_ARGUMENT", f"invalid plan: {error}") from error
