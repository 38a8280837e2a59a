"""Connections to nodes: one pyarrow Flight client per address, shared by threads, and
the ``mink-applied-index`` headers that give read-your-writes across nodes."""

from __future__ import annotations

import json
import threading
from typing import Any, Callable, Iterator, TypeVar

import pyarrow.flight as flight

from .errors import MinkError, from_flight

T = TypeVar("T")


class _Applied:
    """The highest metadata index any node answered; sent back as
    ``mink-min-applied-index`` so a node that is behind waits until it has caught up."""

    def __init__(self) -> None:
        self.index = 0
        self.lock = threading.Lock()

    def saw(self, value: int) -> None:
        with self.lock:
            if value > self.index:
                self.index = value


class _Middleware(flight.ClientMiddleware):  # type: ignore[misc]
    def __init__(self, applied: _Applied, compression: str | None) -> None:
        super().__init__()
        self.applied = applied
        self.compression = compression

    def sending_headers(self) -> dict[str, str]:
        index = self.applied.index
        headers = {"mink-min-applied-index": str(index)} if index else {}
        if self.compression:
            # Reads answer compressed IPC bodies (pyarrow decodes them as they come).
            headers["mink-read-compression"] = self.compression
        return headers

    def received_headers(self, headers: dict[str, list[Any]]) -> None:
        for value in headers.get("mink-applied-index", []):
            try:
                self.applied.saw(int(value if isinstance(value, str) else value.decode()))
            except (ValueError, AttributeError):
                pass


class _Factory(flight.ClientMiddlewareFactory):  # type: ignore[misc]
    def __init__(self, applied: _Applied, compression: str | None) -> None:
        super().__init__()
        self.applied = applied
        self.compression = compression

    def start_call(self, info: Any) -> _Middleware:
        return _Middleware(self.applied, self.compression)


def location(address: str) -> str:
    """``grpc://host:port`` for ``host:port`` or a location already."""
    return address if "://" in address else f"grpc://{address}"


class Connections:
    """Flight clients by address, the bootstrap address first."""

    def __init__(self, address: str, timeout: float | None, compression: str | None = None) -> None:
        if compression not in (None, "none", "zstd", "lz4"):
            raise ValueError(f"compression {compression!r} is not one of zstd, lz4, none")
        self.bootstrap = location(address)
        self.timeout = timeout
        self.compression = compression
        self.applied = _Applied()
        self._clients: dict[str, flight.FlightClient] = {}
        self._lock = threading.Lock()

    def client(self, address: str | None = None) -> flight.FlightClient:
        loc = location(address) if address else self.bootstrap
        with self._lock:
            c = self._clients.get(loc)
            if c is None:
                c = flight.FlightClient(loc, middleware=[_Factory(self.applied, self.compression)])
                self._clients[loc] = c
            return c

    def options(self, timeout: float | None = None) -> flight.FlightCallOptions:
        t = timeout if timeout is not None else self.timeout
        return flight.FlightCallOptions(timeout=t)

    def call(self, fn: Callable[[flight.FlightClient], T], address: str | None = None) -> T:
        """``fn`` on the client of ``address``, with pyarrow's errors as Mink's."""
        try:
            return fn(self.client(address))
        except (MinkError, StopIteration):
            raise
        except Exception as e:  # noqa: BLE001 - every Flight failure becomes a MinkError
            raise from_flight(e) from e

    def action_raw(self, name: str, body: Any = None, address: str | None = None) -> bytes:
        payload = json.dumps({} if body is None else body).encode()

        def run(c: flight.FlightClient) -> bytes:
            results = list(c.do_action(flight.Action(name, payload), options=self.options()))
            return b"".join(r.body.to_pybytes() for r in results)

        return self.call(run, address)

    def action(self, name: str, body: Any = None, address: str | None = None) -> Any:
        return json.loads(self.action_raw(name, body, address) or b"null")

    def close(self) -> None:
        with self._lock:
            for c in self._clients.values():
                try:
                    c.close()
                except Exception:  # noqa: BLE001 - closing is best effort
                    pass
            self._clients.clear()


def stream_errors(it: Iterator[T]) -> Iterator[T]:
    """``it`` with pyarrow's errors raised as Mink's."""
    try:
        yield from it
    except MinkError:
        raise
    except Exception as e:  # noqa: BLE001
        raise from_flight(e) from e
