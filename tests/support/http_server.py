"""The real `graph-kvcache-mcp serve --transport http` in a subprocess, for end-to-end tests."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from graph_kvcache_mcp.connectors.processes.ports import free_port, port_in_use
from tests.support.processes import clean_env, venv_script, wait_until


@dataclass
class HttpServer:
    """A running HTTP server; `output` holds its stdout + stderr once the block has exited."""

    url: str
    process: subprocess.Popen[bytes]
    output: list[str] = field(default_factory=list)

    @property
    def stderr(self) -> str:
        return "".join(self.output)


@contextmanager
def http_server(env: dict[str, str], *flags: str) -> Iterator[HttpServer]:
    """Start the console script on a free loopback port with `env` (on top of a clean
    environment), wait for the port, and terminate it on exit."""
    port = free_port()
    command = [str(venv_script("graph-kvcache-mcp")), "serve", "--transport", "http"]
    process = subprocess.Popen(
        [*command, "--port", str(port), *flags],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(**env),
    )
    server = HttpServer(f"http://127.0.0.1:{port}/mcp", process)
    try:
        wait_until(
            lambda: port_in_use("127.0.0.1", port) or process.poll() is not None,
            timeout_s=30,
            what="the HTTP port",
        )
        if process.poll() is not None:
            out, err = process.communicate(timeout=5)
            raise AssertionError(f"the server exited: {out.decode()}{err.decode()}")
        yield server
    finally:
        if process.poll() is None:
            process.terminate()
        out, err = process.communicate(timeout=20)
        server.output.append(out.decode() + err.decode())
