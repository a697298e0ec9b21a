"""A double of a vLLM server for a network namespace where a real one cannot run cheaply.

`python -m tests.support.vllm_double HOST PORT REQUEST_LOG READY_FIFO` serves `GET /metrics`
(a real vLLM capture from tests/data) and `GET /v1/models`, records every request's method,
path and Authorization header as one JSON line in REQUEST_LOG, and writes one line to
READY_FIFO once it listens. It exits when its parent does (Linux parent-death signal), so it
never outlives the server under test that `exec`s in that parent.
"""

from __future__ import annotations

import ctypes
import json
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

METRICS = (Path(__file__).resolve().parents[1] / "data" / "vllm_metrics_single.prom").read_bytes()
MODEL = "Qwen/Qwen3-0.6B"
_PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> None:
    host, port, request_log, ready = argv
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    log = Path(request_log)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            record = {
                "method": "GET",
                "path": self.path,
                "authorization": self.headers.get("Authorization"),
            }
            with log.open("a") as handle:
                handle.write(json.dumps(record) + "\n")
            if self.path == "/metrics":
                self._reply(METRICS, "text/plain; version=0.0.4")
            elif self.path == "/v1/models":
                body = {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
                self._reply(json.dumps(body).encode(), "application/json")
            else:
                self.send_error(404)

        def _reply(self, body: bytes, content_type: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # the request log above is the record

    server = ThreadingHTTPServer((host, int(port)), Handler)
    with open(ready, "w") as signal_ready:
        signal_ready.write("listening\n")
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
