from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Plan(_message.Message):
    __slots__ = ("num_records", "batch_size", "seed", "shuffle", "num_epochs", "drop_remainder")
    NUM_RECORDS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_FIELD_NUMBER: _ClassVar[int]
    NUM_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    DROP_REMAINDER_FIELD_NUMBER: _ClassVar[int]
    num_records: int
    batch_size: int
    seed: int
    shuffle: bool
    num_epochs: int
    drop_remainder: bool
    def __init__(self, num_records: _Optional[int] = ..., batch_size: _Optional[int] = ..., seed: _Optional[int] = ..., shuffle: _Optional[bool] = ..., num_epochs: _Optional[int] = ..., drop_remainder: _Optional[bool] = ...) -> None: ...

class HandshakeRequest(_message.Message):
    __slots__ = ("library_version", "pipeline", "plan")
    LIBRARY_VERSION_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    library_version: str
    pipeline: str
    plan: Plan
    def __init__(self, library_version: _Optional[str] = ..., pipeline: _Optional[str] = ..., plan: _Optional[_Union[Plan, _Mapping]] = ...) -> None: ...

class HandshakeResponse(_message.Message):
    __slots__ = ("library_version", "pipeline", "fingerprint", "num_records", "stream_window")
    LIBRARY_VERSION_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    NUM_RECORDS_FIELD_NUMBER: _ClassVar[int]
    STREAM_WINDOW_FIELD_NUMBER: _ClassVar[int]
    library_version: str
    pipeline: str
    fingerprint: str
    num_records: int
    stream_window: int
    def __init__(self, library_version: _Optional[str] = ..., pipeline: _Optional[str] = ..., fingerprint: _Optional[str] = ..., num_records: _Optional[int] = ..., stream_window: _Optional[int] = ...) -> None: ...

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
    __slots__ = ("pipeline", "fingerprint", "plan", "step", "rows", "window")
    PIPELINE_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    pipeline: str
    fingerprint: str
    plan: Plan
    step: int
    rows: _containers.RepeatedScalarFieldContainer[int]
    window: StreamWindow
    def __init__(self, pipeline: _Optional[str] = ..., fingerprint: _Optional[str] = ..., plan: _Optional[_Union[Plan, _Mapping]] = ..., step: _Optional[int] = ..., rows: _Optional[_Iterable[int]] = ..., window: _Optional[_Union[StreamWindow, _Mapping]] = ...) -> None: ...

class BatchResponse(_message.Message):
    __slots__ = ("step", "payload")
    STEP_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    step: int
    payload: bytes
    def __init__(self, step: _Optional[int] = ..., payload: _Optional[bytes] = ...) -> None: ...

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
    __slots__ = ("library_version", "pipelines")
    LIBRARY_VERSION_FIELD_NUMBER: _ClassVar[int]
    PIPELINES_FIELD_NUMBER: _ClassVar[int]
    library_version: str
    pipelines: _containers.RepeatedCompositeFieldContainer[PipelineInfo]
    def __init__(self, library_version: _Optional[str] = ..., pipelines: _Optional[_Iterable[_Union[PipelineInfo, _Mapping]]] = ...) -> None: ...

class ErrorReply(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...
