"""Is a vLLM server healthy, what does it serve, and what does its log say when it is not."""

from __future__ import annotations

from pathlib import Path

import httpx2

from graph_kvcache_mcp.connectors.processes.control import tail
from graph_kvcache_mcp.domain.vllm.endpoint import VllmEndpoint


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
        return False, [], f"no answer from {root} ({type(exc).__name__})"
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


def vllm_reason(log_path: Path) -> str:
    """The most telling line of vLLM's log: the last exception or error line, else the last line."""
    lines = [line.strip() for line in tail(log_path, 200).splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("=== graph-kvcache-mcp:")]
    for marker in ("Error:", "Exception:", "ERROR"):
        hits = [line for line in lines if marker in line]
        if hits:
            return hits[-1][-400:]
    return (lines or ["(empty log)"])[-1][-400:]


def last_log_line(log_path: Path) -> str:
    """The last non-empty line of the log, shortened, for progress notes."""
    lines = [line for line in tail(log_path, 5).splitlines() if line.strip()]
    return (lines[-1].strip()[-120:] if lines else "no log output yet") or "no log output yet"
