"""Mink's Python client: tables of Arrow rows on object storage, from pyarrow, pandas
and Polars.

>>> import mink
>>> client = mink.connect("grpc://127.0.0.1:9120")          # doctest: +SKIP
>>> events = client.table("demo.events")                    # doctest: +SKIP
>>> events.append([{"id": 1, "msg": "hello"}])              # doctest: +SKIP
>>> events.scan().to_pandas()                               # doctest: +SKIP
"""

from .client import Client, connect
from .errors import (
    AlreadyExists,
    Fenced,
    Internal,
    InvalidArgument,
    LimitExceeded,
    MinkError,
    NotFound,
    NotLeader,
    OffsetOutOfRange,
    OutOfOrderSequence,
    SchemaMismatch,
    StorageFailure,
    Unavailable,
    Unimplemented,
)
from .result import ScanResult
from .table import Table
from .tail import Tail, TailBatch
from .types import to_arrow_type, to_mink_type
from .writer import BucketWritten, Writer

__version__ = "0.1.0"

__all__ = [
    "connect",
    "Client",
    "Table",
    "Writer",
    "BucketWritten",
    "ScanResult",
    "Tail",
    "TailBatch",
    "to_arrow_type",
    "to_mink_type",
    "MinkError",
    "NotLeader",
    "Unavailable",
    "InvalidArgument",
    "NotFound",
    "AlreadyExists",
    "SchemaMismatch",
    "OutOfOrderSequence",
    "OffsetOutOfRange",
    "Fenced",
    "StorageFailure",
    "LimitExceeded",
    "Unimplemented",
    "Internal",
]
