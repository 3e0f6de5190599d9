"""A real webhook receiver on 127.0.0.1 for the delivery tests."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    """Answers POSTs with scripted statuses, then `default`, with `headers` on every answer;
    given `hold_until`, it holds each request open until that event is set. It records each
    request (headers, body) as it arrives, counts the requests it has answered, and the most
    it held open at once."""

    def __init__(self, statuses=(), default=200, hold_until: threading.Event | None = None,
                 headers: dict[str, str] | None = None):
        self.statuses = list(statuses)
        self.requests: list[tuple[dict, bytes]] = []
        self.answered = 0
        self.most_open = 0
        self._open = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["content-length"]))
                with receiver._lock:
                    receiver.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                    status = receiver.statuses.pop(0) if receiver.statuses else default
                    receiver._open += 1
                    receiver.most_open = max(receiver.most_open, receiver._open)
                if hold_until is not None:
                    hold_until.wait(timeout=10)  # bounded: a send that waits on its delivery fails, not hangs
                with receiver._lock:  # before the answer goes out, after which the sender may send again
                    receiver._open -= 1
                    receiver.answered += 1
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_port
        self.url = f"http://127.0.0.1:{self.port}/hooks"
        # A short poll interval keeps shutdown() from costing half a second per test.
        threading.Thread(target=self.server.serve_forever, args=(0.01,), daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
