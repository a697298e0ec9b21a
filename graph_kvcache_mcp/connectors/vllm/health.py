"""Is a vLLM server healthy, what does it serve, and what does its log say when it is not."""

from __future__ import annotations

import re
from pathlib import Path

import httpx2

from graph_kvcache_mcp.connectors.net.tls_trust import certificate_reason
from graph_kvcache_mcp.connectors.processes.control import tail
from graph_kvcache_mcp.domain.vllm.endpoint import VllmEndpoint
from graph_kvcache_mcp.domain.vllm.worker_death import WorkerDeath, worker_death


def probe_server(base_url: str, *, timeout_s: float = 3.0) -> tuple[bool, list[str], str | None]:
    """(healthy, served model names, reason when not healthy) for a vLLM base URL."""
    root = VllmEndpoint.of(base_url).root
    try:
        with httpx2.Client(timeout=timeout_s) as http:
            health = http.get(root + "/health")
            if health.status_code != 200:
                return False, [], f"/health answered HTTP {health.status_code}"
            models = http.get(root + "/v1/models")
    except httpx2.HTTPError as exc:
        untrusted = certificate_reason(exc)
        return False, [], untrusted or f"no answer from {root} ({type(exc).__name__})"
    if models.status_code != 200:
        return True, [], None  # healthy; an older server may not list its models
    try:
        payload = models.json()
    except ValueError:
        # A proxy's page or another service on the port answers 200 with no JSON: not vLLM.
        kind = models.headers.get("content-type", "no content-type")
        return (
            False,
            [],
            (
                f"{root} sent a bad answer (/v1/models is not JSON: {kind}); check that "
                "VLLM_BASE_URL points at vLLM itself"
            ),
        )
    data = payload.get("data") if isinstance(payload, dict) else None
    served = (
        [str(m.get("id")) for m in data if isinstance(m, dict)] if isinstance(data, list) else []
    )
    return True, served, None


GENERIC_FAILURES = (
    "Engine core initialization failed",
    "EngineCore failed to start",
    "See root cause above",
    "APIServer failed to start",
)
"""Lines vLLM's front process prints about a child's failure, naming no cause: the cause is the
child's own exception, logged above them."""
_RENDEZVOUS = re.compile(r"distributed_init_method=file://(\S*/vllm_dist_[0-9a-f]{32})\b")


def vllm_reason(log_path: Path) -> str:
    """The most telling line of vLLM's log since our last start: the last exception or error
    line that names a cause (not vLLM's generic "Engine core initialization failed"), else the
    last line."""
    lines = [line.strip() for line in since_start(tail(log_path, 400)) if line.strip()]
    telling = [line for line in lines if not any(text in line for text in GENERIC_FAILURES)]
    for marker in ("Error:", "Exception:", "ERROR"):
        hits = [line for line in telling if marker in line]
        if hits:
            return hits[-1][-400:]
    return (lines or ["(empty log)"])[-1][-400:]


def rendezvous_files(log_path: Path) -> list[Path]:
    """The `vllm_dist_*` rendezvous files (torch's FileStore) vLLM named in its log since our
    last start: vLLM creates one in the temp dir per start and never removes it."""
    text = tail(log_path, 100_000, max_bytes=4 * 1024 * 1024)
    found = _RENDEZVOUS.findall("\n".join(since_start(text)))
    return [Path(name) for name in dict.fromkeys(found)]


DEATH_TAIL_LINES = 20_000
DEATH_TAIL_BYTES = 2 * 1024 * 1024
"""Enough for a worker's death, the faulthandler dump before it (~100 lines) and the last
scheduler stats (every 10 s), even after thousands of HTTP 500 lines from clients that kept
calling."""


def read_worker_death(log_path: Path) -> WorkerDeath | None:
    """The last worker death in vLLM's log since our last start (one before a restart is
    history), or None: no log, no death."""
    if not log_path.is_file():
        return None
    return worker_death(since_start(tail(log_path, DEATH_TAIL_LINES, max_bytes=DEATH_TAIL_BYTES)))


def since_start(text: str) -> list[str]:
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("=== graph-kvcache-mcp:")]
    return lines[starts[-1] + 1 :] if starts else lines


def last_log_line(log_path: Path) -> str:
    """The last non-empty line of the log, shortened, for progress notes."""
    lines = [line for line in tail(log_path, 5).splitlines() if line.strip()]
    return (lines[-1].strip()[-120:] if lines else "no log output yet") or "no log output yet"
