"""A raw NATS client for the protocol tests: bytes in, bytes out, and whether the server closed."""

from __future__ import annotations

import socket
import time


class Raw:
    """One TCP connection to a NATS server; `info` is the greeting line."""

    def __init__(self, port: int, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.timeout = timeout
        self.buf = b""
        self.closed = False
        self.info = self.read_until(b"\r\n")

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self, deadline: float) -> bool:
        self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            return False
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            self.closed = True
            return False
        self.buf += chunk
        return True

    def read_until(self, end: bytes) -> bytes:
        """Everything up to and including `end`; raises TimeoutError past the deadline."""
        deadline = time.monotonic() + self.timeout
        while end not in self.buf:
            if not self._fill(deadline) and (self.closed or time.monotonic() >= deadline):
                raise TimeoutError(f"no {end!r} in {self.buf[-300:]!r}")
        i = self.buf.index(end) + len(end)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def converse(self, data: bytes) -> tuple[bytes, bool]:
        """Sends `data` (which ends with PING unless the server is expected to close) and reads the
        answer up to the PONG, or to the close. -> (bytes, closed)."""
        self.send(data)
        deadline = time.monotonic() + self.timeout
        while not self.closed and not self.buf.endswith(b"PONG\r\n") and time.monotonic() < deadline:
            self._fill(deadline)
        out, self.buf = self.buf, b""
        return out, self.closed

    def close(self) -> None:
        self.sock.close()


def converse(port: int, data: bytes) -> tuple[bytes, bool]:
    raw = Raw(port)
    try:
        return raw.converse(data)
    finally:
        raw.close()
