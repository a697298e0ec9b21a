"""A stand-in for vLLM's API server (a test double): serves `/health` and `/v1/models` on the
planned `--port` and appends the environment variables named in `STAND_IN_RECORD_NAMES` to
`STAND_IN_RECORD` (one JSON line per process).

For lifecycle rules (what a restart passes on) where a real vLLM start would cost a minute and
prove nothing more. `stand_in_vllm(dir)` writes a `vllm` package whose API server entry module
runs this one; put the returned path first on the child's PYTHONPATH and run it with this very
interpreter, so the process looks like ours to the lifecycle code (same argv[0]).
"""

from __future__ import annotations

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def stand_in_vllm(directory: Path) -> str:
    """A PYTHONPATH value under which `python -m vllm.entrypoints.openai.api_server` is this."""
    package = directory / "stand-in" / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for level in (package, package.parent, package.parent.parent):
        (level / "__init__.py").write_text("")
    (package / "api_server.py").write_text(
        "import sys\nfrom tests.support.vllm_stand_in import main\nmain(sys.argv[1:])\n"
    )
    return f"{directory / 'stand-in'}:{REPO}"


def main(argv: list[str]) -> None:
    port = int(argv[argv.index("--port") + 1])
    model = argv[argv.index("--served-model-name") + 1] if "--served-model-name" in argv else ""
    names = os.environ.get("STAND_IN_RECORD_NAMES", "").split(",")
    with Path(os.environ["STAND_IN_RECORD"]).open("a") as record:
        record.write(json.dumps({name: os.environ.get(name) for name in names}) + "\n")
    listing = json.dumps({"data": [{"id": model}]}).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = listing if self.path == "/v1/models" else b"{}"
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
