"""Targets that misbehave below HTTP, for the exporter and Locust fault tests (support.sse has the
ones that speak well-formed HTTP with a bad stream inside).

    endless       answers every request with 200 and a chunked body that never ends (`rate` bytes/s)
    hung          accepts, reads the request, and never answers
    accept_close  accepts and closes at once, before reading anything

All on 127.0.0.1. As a process (the Locust tests run it apart from pytest):
`python tests/support/faulty.py PORT_FILE MODE`.
"""

from __future__ import annotations

import contextlib
import socket
import socketserver
import sys
import threading
import time
from pathlib import Path

MODES = ("endless", "hung", "accept_close")


class FaultyServer:
    def __init__(self, mode: str, *, rate: int = 1 << 20) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown faulty server mode {mode!r}; known: {MODES}")
        self.mode = mode
        self.rate = rate
        self.connections = 0
        self._stop = threading.Event()
        self._server: socketserver.ThreadingTCPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FaultyServer:
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                outer.connections += 1
                with contextlib.suppress(OSError):
                    getattr(outer, "_" + outer.mode)(self.request)

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FaultyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _read_head(self, sock: socket.socket) -> None:
        sock.settimeout(5)
        data = b""
        while b"\r\n\r\n" not in data:
            got = sock.recv(65536)
            if not got:
                return
            data += got

    def _endless(self, sock: socket.socket) -> None:
        self._read_head(sock)
        sock.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        # No newline anywhere: a line-based reader buffers all of it.
        piece = b"x" * 65536
        chunk = b"%x\r\n%s\r\n" % (len(piece), piece)
        pause = len(piece) / self.rate
        while not self._stop.is_set():
            sock.sendall(chunk)
            self._stop.wait(pause)

    def _hung(self, sock: socket.socket) -> None:
        self._read_head(sock)
        self._stop.wait()

    def _accept_close(self, sock: socket.socket) -> None:
        sock.close()


def main(argv: list[str]) -> None:
    port_file, mode = Path(argv[0]), argv[1]
    server = FaultyServer(mode).start()
    port_file.write_text(server.url.rsplit(":", 1)[1])
    while True:  # until the test terminates the process
        time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1:])
