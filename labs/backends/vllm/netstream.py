"""An httpx transport that knows when each piece of a response reached this machine.

The load generator times every streamed chunk. Taking `time.monotonic()` where the chunk is parsed
would add the client's own queueing: when a vLLM step answers 256 streams at once, the last of them
is parsed many milliseconds after its bytes arrived. So this transport asks the kernel to stamp
every TCP read (SO_TIMESTAMPNS, Linux) and keeps the stamp next to the bytes; the load generator
reads `last_arrival_s` of the response's network stream after each piece of body it gets.
Where the kernel gives no stamp (another OS, or an implausible one), the stamp is the moment the
socket was found readable, which is still ahead of any parsing.

Stamps are exact as long as each socket is read before the next chunk of the same stream lands
(the kernel merges unread pieces and keeps the newest stamp). The event loop alone would not
manage that: it reads sockets only between steps, and parsing a burst of 256 chunks through
httpx takes ~20 ms here (~75 us each), as long as a short inter-token gap. So every read of any
stream first sweeps all sockets with a zero-timeout epoll and files whatever has arrived,
stamped, under its own stream.

It also notes `request_sent_s`, the moment a request's first byte was handed to the socket, so a
request's arrival time does not include time spent waiting for a connection.

All times are `time.monotonic()` seconds; kernel stamps (CLOCK_REALTIME) are converted with the
offset between the two clocks (_WallOffset).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import select
import socket
import struct
import sys
import time
import typing
from collections import deque

import httpcore
import httpx

# Linux values; Python's socket module does not export them.
_SO_TIMESTAMPNS = 35
_SCM_TIMESTAMPNS = _SO_TIMESTAMPNS
_TIMESPEC = struct.Struct("@qq")
_ANC_SIZE = socket.CMSG_SPACE(_TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0
_READ_SIZE = 65536
# A stamp older than this (or in the future) is not believed: clock step, or a kernel that
# stamps loopback packets with another clock.
_MAX_STAMP_AGE_S = 5.0
# Stop reading from the socket while this many bytes wait for the client (flow control).
_HIGH_WATER = 4 * 1024 * 1024


class TimedStream(httpcore.AsyncNetworkStream):
    """A TCP connection whose reads carry their arrival time."""

    def __init__(self, sock: socket.socket, kernel_stamps: bool, backend: TimedBackend) -> None:
        self._sock = sock
        self._fd = sock.fileno()
        self._backend = backend
        self._loop = asyncio.get_running_loop()
        self._kernel_stamps = kernel_stamps
        self._pieces: deque[tuple[float, bytes]] = deque()
        self._buffered = 0
        self._eof = False
        self._error: OSError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._reading = False
        self._closed = False
        self._answering = True  # the last thing done was a read: the next write starts a request
        self.last_arrival_s: float | None = None
        self.request_sent_s: float | None = None
        self._start_reading()

    # -- socket side: the event loop's reader callback, and TimedBackend.sweep() -----------------

    def _start_reading(self) -> None:
        if not self._reading and not self._closed and not self._eof:
            self._loop.add_reader(self._fd, self._on_readable)
            self._backend.watch(self._fd, self)
            self._reading = True

    def _stop_reading(self) -> None:
        if self._reading:
            self._loop.remove_reader(self._fd)
            self._backend.unwatch(self._fd)
            self._reading = False

    def _on_readable(self) -> None:
        # Drain what is there now, each recv with its own stamp.
        for _ in range(64):
            try:
                if self._kernel_stamps:
                    data, ancdata, _flags, _addr = self._sock.recvmsg(_READ_SIZE, _ANC_SIZE)
                else:
                    data, ancdata = self._sock.recv(_READ_SIZE), []
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                self._error = exc
                self._stop_reading()
                break
            if not data:
                self._eof = True
                self._stop_reading()
                break
            self._pieces.append((_arrival(ancdata), data))
            self._buffered += len(data)
            if self._buffered > _HIGH_WATER:
                self._stop_reading()
                break
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # -- httpcore side ---------------------------------------------------------------------------

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self._answering = True
        self._backend.sweep()
        while not self._pieces:
            if self._error is not None:
                raise httpcore.ReadError(str(self._error))
            if self._eof or self._closed:
                return b""
            self._waiter = self._loop.create_future()
            try:
                await asyncio.wait_for(self._waiter, timeout)
            except TimeoutError:
                raise httpcore.ReadTimeout(f"no data for {timeout} s") from None
            finally:
                self._waiter = None
        arrival, data = self._pieces.popleft()
        if len(data) > max_bytes:
            self._pieces.appendleft((arrival, data[max_bytes:]))
            data = data[:max_bytes]
        self._buffered -= len(data)
        if self._buffered <= _HIGH_WATER // 2:
            self._start_reading()
        self.last_arrival_s = arrival
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        if self._answering:
            self._answering = False
            self.request_sent_s = time.monotonic()
        # Send at once when the socket takes it: awaiting (wait_for makes a task) would let
        # other requests run between this request's headers and its body, and delay it.
        view = memoryview(buffer)
        try:
            while view:
                view = view[self._sock.send(view) :]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as exc:
            raise httpcore.WriteError(str(exc)) from exc
        if not view:
            return
        try:
            await asyncio.wait_for(self._loop.sock_sendall(self._sock, view), timeout)
        except TimeoutError:
            raise httpcore.WriteTimeout(f"could not send for {timeout} s") from None
        except OSError as exc:
            raise httpcore.WriteError(str(exc)) from exc

    async def aclose(self) -> None:
        if not self._closed:
            self._stop_reading()
            self._closed = True
            self._sock.close()
            self._backend.forget(self)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def start_tls(
        self, *args: typing.Any, **kwargs: typing.Any
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError(
            "TimedStream is for plain http; https uses httpx's own transport"
        )

    def get_extra_info(self, info: str) -> typing.Any:
        if info == "is_readable":
            # httpcore asks this of an idle keep-alive connection: readable means it was closed.
            return self._eof or bool(self._pieces) or self._error is not None
        if info == "socket":
            return self._sock
        if info == "client_addr":
            return self._sock.getsockname()
        if info == "server_addr":
            return self._sock.getpeername()
        return None


class _WallOffset:
    """CLOCK_REALTIME minus CLOCK_MONOTONIC, to turn kernel stamps into monotonic times.

    Read as a monotonic reading either side of a wall-clock reading, keeping the tightest of a
    few tries: a process descheduled between two readings would otherwise shift every stamp by
    however long it waited. Refreshed every second, in case the wall clock is stepped.
    """

    def __init__(self) -> None:
        self._offset = 0.0
        self._measured_at = -math.inf

    def get(self, now: float) -> float:
        if now - self._measured_at > 1.0:
            best = math.inf
            for _ in range(5):
                before = time.monotonic()
                wall = time.time()
                after = time.monotonic()
                if after - before < best:
                    best, self._offset = after - before, wall - (before + after) / 2
            self._measured_at = now
        return self._offset


_wall_offset = _WallOffset()


def _arrival(ancdata: list[tuple[int, int, bytes]]) -> float:
    """The monotonic time a received piece arrived: the kernel's stamp if it has a sane one,
    else now."""
    now = time.monotonic()
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == _SCM_TIMESTAMPNS and len(payload) >= 16:
            sec, nsec = _TIMESPEC.unpack_from(payload)
            arrived = sec + nsec / 1e9 - _wall_offset.get(now)
            if now - _MAX_STAMP_AGE_S <= arrived <= now:
                return arrived
            if now < arrived < now + 0.001:  # the offset is known to a few microseconds
                return now
    return now


class TimedBackend(httpcore.AsyncNetworkBackend):
    """Opens TimedStreams: non-blocking TCP sockets with TCP_NODELAY and, on Linux, kernel
    receive timestamps."""

    def __init__(self) -> None:
        self.kernel_stamps = sys.platform.startswith("linux") and _ANC_SIZE > 0
        # Every open stream's socket, for sweep(); epoll only where the kernel stamps too.
        self._epoll = select.epoll() if self.kernel_stamps and hasattr(select, "epoll") else None
        self._watched: dict[int, TimedStream] = {}
        self._streams: set[TimedStream] = set()

    def watch(self, fd: int, stream: TimedStream) -> None:
        if self._epoll is not None and fd not in self._watched:
            self._epoll.register(fd, select.EPOLLIN)
            self._watched[fd] = stream

    def unwatch(self, fd: int) -> None:
        if self._watched.pop(fd, None) is not None and self._epoll is not None:
            with contextlib.suppress(OSError, ValueError):
                self._epoll.unregister(fd)

    def forget(self, stream: TimedStream) -> None:
        self._streams.discard(stream)

    def sweep(self) -> None:
        """Read every socket that has data now, so each piece keeps its own kernel stamp."""
        if self._epoll is None or not self._watched:
            return
        for fd, _events in self._epoll.poll(0):
            stream = self._watched.get(fd)
            if stream is not None:
                stream._on_readable()

    def close(self) -> None:
        """Close streams httpcore left open, and the epoll object."""
        for stream in list(self._streams):
            stream._stop_reading()
            stream._sock.close()
        self._streams.clear()
        if self._epoll is not None:
            self._epoll.close()
            self._epoll = None

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[typing.Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), timeout
            )
        except (OSError, TimeoutError) as exc:
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from exc
        last: Exception | None = None
        for family, kind, proto, _name, address in infos:
            sock = socket.socket(family, kind, proto)
            sock.setblocking(False)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                for option in socket_options or ():
                    sock.setsockopt(*option)
                stamps = self.kernel_stamps
                if stamps:
                    try:
                        sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
                    except OSError:
                        stamps = False
                await asyncio.wait_for(loop.sock_connect(sock, address), timeout)
                stream = TimedStream(sock, stamps, self)
                self._streams.add(stream)
                return stream
            except TimeoutError as exc:
                sock.close()
                raise httpcore.ConnectTimeout(f"connecting to {host}:{port} timed out") from exc
            except OSError as exc:
                sock.close()
                last = exc
        raise httpcore.ConnectError(f"cannot connect to {host}:{port}: {last}")

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: typing.Iterable[typing.Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("unix sockets are not supported here")

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class _TimedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport over a connection pool of TimedStreams.

    httpx 0.28 builds its pool in __init__ with no argument for the network backend, so the pool
    is built again here, with the same limits and a TimedBackend.
    """

    def __init__(self, max_connections: int) -> None:
        super().__init__(trust_env=False)
        self.backend = TimedBackend()
        self._pool = httpcore.AsyncConnectionPool(
            max_connections=max_connections,
            max_keepalive_connections=max_connections,
            keepalive_expiry=60.0,
            network_backend=self.backend,
        )

    async def aclose(self) -> None:
        await super().aclose()
        self.backend.close()


def timed_client(
    base_url: str, *, max_connections: int, timeout: httpx.Timeout
) -> httpx.AsyncClient:
    """An AsyncClient for `base_url`: the timed transport for http, httpx's own for https."""
    transport: httpx.AsyncBaseTransport
    if httpx.URL(base_url).scheme == "http":
        transport = _TimedTransport(max_connections)
    else:
        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        transport = httpx.AsyncHTTPTransport(limits=limits, trust_env=False)
    return httpx.AsyncClient(
        base_url=base_url, transport=transport, timeout=timeout, trust_env=False
    )
