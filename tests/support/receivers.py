"""Local receivers for notifications: an HTTP server that stands in for a Slack incoming
webhook or a webhook endpoint, and an SMTP server (aiosmtpd), each keeping what it was sent.
An HTTP receiver can be told to answer with an error (a receiver that is down)."""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field
from email import message_from_bytes, policy
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from aiosmtpd.controller import Controller


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class HttpReceiver:
    """POSTs kept in order; ``status`` is what each one is answered with."""

    status: int = 200
    #: Seconds each answer waits (a receiver that hangs).
    delay: float = 0.0
    received: list[Received] = field(default_factory=list)
    #: Requests answered with an error (kept apart from ``received``).
    refused: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    def start(self) -> HttpReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                size = int(self.headers.get("Content-Length") or 0)
                got = Received(self.path, dict(self.headers.items()), self.rfile.read(size))
                with receiver.lock:
                    status, delay = receiver.status, receiver.delay
                if delay:
                    time.sleep(delay)
                with receiver.lock:
                    (receiver.received if status < 300 else receiver.refused).append(got)
                body = b"ok" if status < 300 else b"receiver is down"
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    def bodies(self) -> list[Any]:
        with self.lock:
            return [r.json() for r in self.received]

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


class _Keep:
    def __init__(self, box: list[EmailMessage]) -> None:
        self.box = box

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        msg = message_from_bytes(envelope.content, policy=policy.default)
        assert isinstance(msg, EmailMessage)
        self.box.append(msg)
        return "250 OK"


class SmtpReceiver:
    """An SMTP server on a free port keeping every message it is sent."""

    def __init__(self) -> None:
        self.messages: list[EmailMessage] = []
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        self._controller = Controller(_Keep(self.messages), hostname="127.0.0.1", port=port)

    def start(self) -> SmtpReceiver:
        self._controller.start()
        return self

    @property
    def url(self) -> str:
        return f"smtp://127.0.0.1:{self._controller.port}"

    def stop(self) -> None:
        self._controller.stop()
