"""A TCP proxy on 127.0.0.1 that a test can cut, to take a service away from one process only, or
make PostgreSQL's answer to one statement go missing (:meth:`TcpProxy.lose_next_answer`)."""

from __future__ import annotations

import contextlib
import socket
import threading


class TcpProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._open = True
        self._losing = threading.Event()
        #: Answers dropped by :meth:`lose_next_answer`.
        self.answers_lost = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self._open:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._answers, args=(upstream, client), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def _answers(self, upstream: socket.socket, client: socket.socket) -> None:
        """The server's side: passed on, unless an answer is to be lost (:meth:`lose_next_answer`)."""
        dropped = b""
        with contextlib.suppress(OSError):
            while data := upstream.recv(65536):
                if not self._losing.is_set():
                    client.sendall(data)
                    continue
                dropped += data
                if _ready_for_query(dropped):
                    self._losing.clear()
                    self.answers_lost += 1
                    self.cut()
                    self.restore()
                    return
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_WR)

    def lose_next_answer(self) -> None:
        """PostgreSQL's next answer is dropped, up to its ReadyForQuery (sent once the statement has
        committed, in autocommit), and every connection is cut then: the client's statement
        committed on the server and its connection dropped before the answer reached it, as in a
        failover. Arm it just before the client sends the statement (no other traffic between)."""
        self._losing.set()

    def cut(self) -> None:
        """Drop every connection and refuse new ones, like a network partition."""
        self._open = False
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._sockets.clear()

    def restore(self) -> None:
        """Accept connections again after :meth:`cut`, like a healed partition."""
        self._open = True

    def close(self) -> None:
        self.cut()
        self.listener.close()


def _ready_for_query(stream: bytes) -> bool:
    """Whether PostgreSQL's message stream ``stream`` (from a message's start) holds a
    ReadyForQuery (``Z``): each message is a type byte and a length that counts itself."""
    offset = 0
    while offset + 5 <= len(stream):
        if stream[offset : offset + 1] == b"Z":
            return True
        offset += 1 + int.from_bytes(stream[offset + 1 : offset + 5], "big")
    return False
