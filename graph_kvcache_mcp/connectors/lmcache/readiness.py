"""Whether the `lmcache server` we started is up: its interpreter can import it, it answers
`GET /healthcheck` as healthy, and both of its ports are held by the process we started (a
neighbour who bound one first would otherwise get vLLM's KV traffic or answer our checks).
The lifecycle is `connectors.lmcache.process`."""

from __future__ import annotations

import http.client
import json
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graph_kvcache_mcp.connectors.lmcache.state import LmcacheState
from graph_kvcache_mcp.connectors.processes.control import stop_process, tail
from graph_kvcache_mcp.connectors.processes.identity import describe_listener, listener_owner
from graph_kvcache_mcp.domain.versions import LMCACHE_PIN, LMCACHE_VERSION
from graph_kvcache_mcp.errors import LmcacheProcessError

if TYPE_CHECKING:
    from graph_kvcache_mcp.connectors.lmcache.process import ManagedLmcache

ENTRY_MODULE = "graph_kvcache_mcp.plugins.lmcache.server"
INSTALL_HINT = (
    f"install LMCache into vLLM's venv (after torch and vllm: `pip install {LMCACHE_PIN}`, then "
    "`pip install --no-deps graph-kvcache-mcp` for our adapter) or a venv of its own, and point "
    "GRAPH_KVCACHE_LMCACHE_PYTHON (or GRAPH_KVCACHE_VLLM_PYTHON) at that venv's python"
)


def check_importable(python: str) -> None:
    """Raise unless `python` exists and can import LMCache and our server entry point."""
    if not Path(python).exists():
        raise LmcacheProcessError(
            f"the LMCache interpreter {python} does not exist; {INSTALL_HINT}"
        )
    probe = (
        "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('lmcache') and "
        f"importlib.util.find_spec({ENTRY_MODULE!r}) else 3)"
    )
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LmcacheProcessError(f"could not run {python} ({exc}); {INSTALL_HINT}") from None
    if done.returncode != 0:
        raise LmcacheProcessError(
            f"lmcache or {ENTRY_MODULE} is not importable by {python}; {INSTALL_HINT}"
        )


def wait_healthy(
    lmcache: ManagedLmcache,
    process: subprocess.Popen[bytes],
    state: LmcacheState,
    timeout_s: float,
    began: float,
) -> None:
    """Return once the server we started is healthy on ports of its own; stop it and raise
    (with the log's last words) when it exits or is not healthy within `timeout_s`."""
    deadline = began + timeout_s
    while time.monotonic() < deadline:
        if (code := process.poll()) is not None:
            lmcache.state_file.clear()
            raise LmcacheProcessError(
                f"lmcache server exited with code {code} before it was healthy: "
                f"{_last_words(lmcache.log_path)} (log: {lmcache.log_path})"
            )
        if get_json(state.http_url + "/healthcheck").get("status") == "healthy":
            _check_ports_ours(lmcache, state)
            return
        time.sleep(0.25)  # poll interval; the deadline above bounds the wait
    stop_process(state.process, term_wait_s=10.0)
    lmcache.state_file.clear()
    raise LmcacheProcessError(
        f"lmcache server was not healthy within {timeout_s:g} s and was stopped: "
        f"{_last_words(lmcache.log_path)} (log: {lmcache.log_path})"
    )


def _check_ports_ours(lmcache: ManagedLmcache, state: LmcacheState) -> None:
    """Both ports are held by the server we started, or it is stopped and the start fails:
    a port free before the start may have been taken by another user in between."""
    ports = [(state.http_port, "admin HTTP")]
    if state.rpc_url is None:  # else the RPC is a socket in our private dir, no port
        ports.append((state.port, "KV RPC"))
    elif not Path(state.rpc_url.removeprefix("ipc://")).is_socket():
        stop_process(state.process, term_wait_s=10.0)
        lmcache.state_file.clear()
        raise LmcacheProcessError(
            f"the lmcache server did not serve its KV RPC at {state.rpc_url} (this LMCache "
            f"may bind only TCP; {ENTRY_MODULE} supports {LMCACHE_VERSION}) and was stopped"
        )
    for port, what in ports:
        if listener_owner(state.process.pid, port, group=True) != "ours":
            stop_process(state.process, term_wait_s=10.0)
            lmcache.state_file.clear()
            raise LmcacheProcessError(
                f"the lmcache server's {what} port {port} is held by another process "
                f"({describe_listener(port)}), not by the server we started (pid "
                f"{state.process.pid}), which was stopped; choose other ports"
            )


def get_json(url: str, *, timeout_s: float = 3.0) -> dict[str, Any]:
    """The JSON object at `url` ({} when the server does not answer with one: refused, timed
    out, or bytes that are not HTTP, which count as "not ready yet", never as a crash)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            payload = json.loads(response.read())
    except (OSError, ValueError, urllib.error.URLError, http.client.HTTPException):
        return {}
    return payload if isinstance(payload, dict) else {}


def _last_words(log_path: Path) -> str:
    lines = [line.strip() for line in tail(log_path, 80).splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("=== graph-kvcache-mcp:")]
    for marker in ("Error", "Exception", "ERROR"):
        hits = [line for line in lines if marker in line]
        if hits:
            return hits[-1][-400:]
    return (lines or ["(empty log)"])[-1][-400:]
