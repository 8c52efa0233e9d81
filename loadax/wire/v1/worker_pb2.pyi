from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Checksum(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHECKSUM_WEIGHTED_SUM: _ClassVar[Checksum]
    CHECKSUM_XXH3_64: _ClassVar[Checksum]
    CHECKSUM_XXH3_CHUNKS: _ClassVar[Checksum]

class Reuse(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REUSE_COMPUTED: _ClassVar[Reuse]
    REUSE_CACHED: _ClassVar[Reuse]
    REUSE_COALESCED: _ClassVar[Reuse]
CHECKSUM_WEIGHTED_SUM: Checksum
CHECKSUM_XXH3_64: Checksum
CHECKSUM_XXH3_CHUNKS: Checksum
REUSE_COMPUTED: Reuse
REUSE_CACHED: Reuse
REUSE_COALESCED: Reuse

class Plan(_message.Message):
    __slots__ = ("num_records", "batch_size", "seed", "shuffle", "num_epochs", "drop_remainder", "batch_size_changes", "start", "blocks")
    NUM_RECORDS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_FIELD_NUMBER: _ClassVar[int]
    NUM_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    DROP_REMAINDER_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_CHANGES_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    num_records: int
    batch_size: int
    seed: int
    shuffle: bool
    num_epochs: int
    drop_remainder: bool
    batch_size_changes: _containers.RepeatedCompositeFieldContainer[BatchSizeChange]
    start: PlanStart
    blocks: BlockShuffle
    def __init__(self, num_records: _Optional[int] = ..., batch_size: _Optional[int] = ..., seed: _Optional[int] = ..., shuffle: _Optional[bool] = ..., num_epochs: _Optional[int] = ..., drop_remainder: _Optional[bool] = ..., batch_size_changes: _Optional[_Iterable[_Union[BatchSizeChange, _Mapping]]] = ..., start: _Optional[_Union[PlanStart, _Mapping]] = ..., blocks: _Optional[_Union[BlockShuffle, _Mapping]] = ...) -> None: ...

class BlockShuffle(_message.Message):
    __slots__ = ("block_size", "window")
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    block_size: int
    window: int
    def __init__(self, block_size: _Optional[int] = ..., window: _Optional[int] = ...) -> None: ...

class BatchSizeChange(_message.Message):
    __slots__ = ("step", "batch_size")
    STEP_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    step: int
    batch_size: int
    def __init__(self, step: _Optional[int] = ..., batch_size: _Optional[int] = ...) -> None: ...

class PlanStart(_message.Message):
    __slots__ = ("step", "epoch", "delivered")
    STEP_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_FIELD_NUMBER: _ClassVar[int]
    step: int
    epoch: int
    delivered: int
    def __init__(self, step: _Optional[int] = ..., epoch: _Optional[int] = ..., delivered: _Optional[int] = ...) -> None: ...

class HandshakeRequest(_message.Message):
    __slots__ = ("library_version", "pipeline", "plan", "host", "probe", "data_socket", "data_key")
    LIBRARY_VERSION_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PROBE_FIELD_NUMBER: _ClassVar[int]
    DATA_SOCKET_FIELD_NUMBER: _ClassVar[int]
    DATA_KEY_FIELD_NUMBER: _ClassVar[int]
    library_version: str
    pipeline: str
    plan: Plan
    host: str
    probe: SharedMemory
    data_socket: bool
    data_key: bytes
    def __init__(self, library_version: _Optional[str] = ..., pipeline: _Optional[str] = ..., plan: _Optional[_Union[Plan, _Mapping]] = ..., host: _Optional[str] = ..., probe: _Optional[_Union[SharedMemory, _Mapping]] = ..., data_socket: _Optional[bool] = ..., data_key: _Optional[bytes] = ...) -> None: ...

class SharedMemory(_message.Message):
    __slots__ = ("pid", "fd", "name")
    PID_FIELD_NUMBER: _ClassVar[int]
    FD_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    pid: int
    fd: int
    name: str
    def __init__(self, pid: _Optional[int] = ..., fd: _Optional[int] = ..., name: _Optional[str] = ...) -> None: ...

class HandshakeResponse(_message.Message):
    __slots__ = ("library_version", "pipeline", "fingerprint", "num_records", "stream_window", "schema", "max_in_flight_per_client", "shared_memory", "data_port", "data_nonce", "loading_slots", "data_requests")
    LIBRARY_VERSION_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    NUM_RECORDS_FIELD_NUMBER: _ClassVar[int]
    STREAM_WINDOW_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_PER_CLIENT_FIELD_NUMBER: _ClassVar[int]
    SHARED_MEMORY_FIELD_NUMBER: _ClassVar[int]
    DATA_PORT_FIELD_NUMBER: _ClassVar[int]
    DATA_NONCE_FIELD_NUMBER: _ClassVar[int]
    LOADING_SLOTS_FIELD_NUMBER: _ClassVar[int]
    DATA_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    library_version: str
    pipeline: str
    fingerprint: str
    num_records: int
    stream_window: int
    schema: BatchSchema
    max_in_flight_per_client: int
    shared_memory: bool
    data_port: int
    data_nonce: bytes
    loading_slots: int
    data_requests: bool
    def __init__(self, library_version: _Optional[str] = ..., pipeline: _Optional[str] = ..., fingerprint: _Optional[str] = ..., num_records: _Optional[int] = ..., stream_window: _Optional[int] = ..., schema: _Optional[_Union[BatchSchema, _Mapping]] = ..., max_in_flight_per_client: _Optional[int] = ..., shared_memory: _Optional[bool] = ..., data_port: _Optional[int] = ..., data_nonce: _Optional[bytes] = ..., loading_slots: _Optional[int] = ..., data_requests: _Optional[bool] = ...) -> None: ...

class BatchSchema(_message.Message):
    __slots__ = ("tree", "leaves")
    TREE_FIELD_NUMBER: _ClassVar[int]
    LEAVES_FIELD_NUMBER: _ClassVar[int]
    tree: str
    leaves: _containers.RepeatedCompositeFieldContainer[LeafSchema]
    def __init__(self, tree: _Optional[str] = ..., leaves: _Optional[_Iterable[_Union[LeafSchema, _Mapping]]] = ...) -> None: ...

class LeafSchema(_message.Message):
    __slots__ = ("dtype", "ndim", "rows_first")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    NDIM_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIRST_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    ndim: int
    rows_first: bool
    def __init__(self, dtype: _Optional[str] = ..., ndim: _Optional[int] = ..., rows_first: _Optional[bool] = ...) -> None: ...

class StreamWindow(_message.Message):
    __slots__ = ("shards", "shard", "index")
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    shards: int
    shard: int
    index: int
    def __init__(self, shards: _Optional[int] = ..., shard: _Optional[int] = ..., index: _Optional[int] = ...) -> None: ...

class BatchRequest(_message.Message):
    __slots__ = ("pipeline", "fingerprint", "plan", "step", "rows", "window", "client", "checksum", "shared_memory", "records", "data_socket", "data_key", "data_id")
    PIPELINE_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    SHARED_MEMORY_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    DATA_SOCKET_FIELD_NUMBER: _ClassVar[int]
    DATA_KEY_FIELD_NUMBER: _ClassVar[int]
    DATA_ID_FIELD_NUMBER: _ClassVar[int]
    pipeline: str
    fingerprint: str
    plan: Plan
    step: int
    rows: _containers.RepeatedScalarFieldContainer[int]
    window: StreamWindow
    client: str
    checksum: Checksum
    shared_memory: SharedMemory
    records: ListedRecords
    data_socket: bool
    data_key: bytes
    data_id: int
    def __init__(self, pipeline: _Optional[str] = ..., fingerprint: _Optional[str] = ..., plan: _Optional[_Union[Plan, _Mapping]] = ..., step: _Optional[int] = ..., rows: _Optional[_Iterable[int]] = ..., window: _Optional[_Union[StreamWindow, _Mapping]] = ..., client: _Optional[str] = ..., checksum: _Optional[_Union[Checksum, str]] = ..., shared_memory: _Optional[_Union[SharedMemory, _Mapping]] = ..., records: _Optional[_Union[ListedRecords, _Mapping]] = ..., data_socket: _Optional[bool] = ..., data_key: _Optional[bytes] = ..., data_id: _Optional[int] = ...) -> None: ...

class ListedRecords(_message.Message):
    __slots__ = ("indices", "epoch")
    INDICES_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    indices: bytes
    epoch: int
    def __init__(self, indices: _Optional[bytes] = ..., epoch: _Optional[int] = ...) -> None: ...

class BatchResponse(_message.Message):
    __slots__ = ("step", "payload", "fingerprint", "request_digest", "checksum", "payload_size", "segment_sizes", "checksum_kind", "shared_memory", "reuse", "load", "loading_slots")
    STEP_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_DIGEST_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_SIZE_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_SIZES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_KIND_FIELD_NUMBER: _ClassVar[int]
    SHARED_MEMORY_FIELD_NUMBER: _ClassVar[int]
    REUSE_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    LOADING_SLOTS_FIELD_NUMBER: _ClassVar[int]
    step: int
    payload: bytes
    fingerprint: str
    request_digest: bytes
    checksum: int
    payload_size: int
    segment_sizes: _containers.RepeatedScalarFieldContainer[int]
    checksum_kind: Checksum
    shared_memory: bool
    reuse: Reuse
    load: float
    loading_slots: int
    def __init__(self, step: _Optional[int] = ..., payload: _Optional[bytes] = ..., fingerprint: _Optional[str] = ..., request_digest: _Optional[bytes] = ..., checksum: _Optional[int] = ..., payload_size: _Optional[int] = ..., segment_sizes: _Optional[_Iterable[int]] = ..., checksum_kind: _Optional[_Union[Checksum, str]] = ..., shared_memory: _Optional[bool] = ..., reuse: _Optional[_Union[Reuse, str]] = ..., load: _Optional[float] = ..., loading_slots: _Optional[int] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PipelineInfo(_message.Message):
    __slots__ = ("name", "fingerprint", "num_records", "stream_window")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    NUM_RECORDS_FIELD_NUMBER: _ClassVar[int]
    STREAM_WINDOW_FIELD_NUMBER: _ClassVar[int]
    name: str
    fingerprint: str
    num_records: int
    stream_window: int
    def __init__(self, name: _Optional[str] = ..., fingerprint: _Optional[str] = ..., num_records: _Optional[int] = ..., stream_window: _Optional[int] = ...) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("library_version", "pipelines", "status", "status_reason")
    LIBRARY_VERSION_FIELD_NUMBER: _ClassVar[int]
    PIPELINES_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STATUS_REASON_FIELD_NUMBER: _ClassVar[int]
    library_version: str
    pipelines: _containers.RepeatedCompositeFieldContainer[PipelineInfo]
    status: str
    status_reason: str
    def __init__(self, library_version: _Optional[str] = ..., pipelines: _Optional[_Iterable[_Union[PipelineInfo, _Mapping]]] = ..., status: _Optional[str] = ..., status_reason: _Optional[str] = ...) -> None: ...

class ErrorReply(_message.Message):
    __slots__ = ("code", "message", "record", "poisoned", "pipeline")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    POISONED_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    record: RecordFailure
    poisoned: PoisonedWork
    pipeline: PipelineFailure
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ..., record: _Optional[_Union[RecordFailure, _Mapping]] = ..., poisoned: _Optional[_Union[PoisonedWork, _Mapping]] = ..., pipeline: _Optional[_Union[PipelineFailure, _Mapping]] = ...) -> None: ...

class PipelineFailure(_message.Message):
    __slots__ = ("step", "cause_type", "cause_message", "traceback", "storage_url")
    STEP_FIELD_NUMBER: _ClassVar[int]
    CAUSE_TYPE_FIELD_NUMBER: _ClassVar[int]
    CAUSE_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    STORAGE_URL_FIELD_NUMBER: _ClassVar[int]
    step: int
    cause_type: str
    cause_message: str
    traceback: str
    storage_url: str
    def __init__(self, step: _Optional[int] = ..., cause_type: _Optional[str] = ..., cause_message: _Optional[str] = ..., traceback: _Optional[str] = ..., storage_url: _Optional[str] = ...) -> None: ...

class PoisonedWork(_message.Message):
    __slots__ = ("work", "rows", "indices", "epochs", "reason")
    WORK_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    INDICES_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    work: str
    rows: _containers.RepeatedScalarFieldContainer[int]
    indices: _containers.RepeatedScalarFieldContainer[int]
    epochs: _containers.RepeatedScalarFieldContainer[int]
    reason: str
    def __init__(self, work: _Optional[str] = ..., rows: _Optional[_Iterable[int]] = ..., indices: _Optional[_Iterable[int]] = ..., epochs: _Optional[_Iterable[int]] = ..., reason: _Optional[str] = ...) -> None: ...

class RecordFailure(_message.Message):
    __slots__ = ("index", "epoch", "cause_type", "cause_message", "traceback")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    CAUSE_TYPE_FIELD_NUMBER: _ClassVar[int]
    CAUSE_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    index: int
    epoch: int
    cause_type: str
    cause_message: str
    traceback: str
    def __init__(self, index: _Optional[int] = ..., epoch: _Optional[int] = ..., cause_type: _Optional[str] = ..., cause_message: _Optional[str] = ..., traceback: _Optional[str] = ...) -> None: ...
