"""What an `Unavailable` from the KV client says: the fault, and what the caller can do about it.

Reasons name the tool or setting that fixes the fault (an agent reads them) and never hold the
token.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypeAlias

from graph_kvcache_mcp.connectors.engine.http_response import WireResponse
from graph_kvcache_mcp.connectors.engine.wire import WireError, WireRefused, WireTimeout
from graph_kvcache_mcp.domain.engine.environment import KV_TOKEN_ENV
from graph_kvcache_mcp.domain.engine.limits import ENGINE_REQUEST_DEADLINE_S, MAX_VALUE_BYTES
from graph_kvcache_mcp.domain.targets import Source

EngineSource: TypeAlias = Source
"""Where the engine's address came from: it decides what a reason tells the caller to do."""


def explain_fault(exc: WireError, url: str, source: EngineSource) -> str:
    """A reason for a request that got no answer."""
    where = f"engine at {url}"
    ours = source != "configured"
    if isinstance(exc, WireRefused):
        if ours:
            return (
                f"{where} is not reachable (connection refused): start the managed engine "
                "with the engine_start tool or `graph-kvcache-mcp engine start`, or set "
                "EPISTEMIC_GRAPH_KVCACHE_URL to an engine that runs"
            )
        return (
            f"{where} is not reachable (connection refused): check that the engine runs "
            "there and that EPISTEMIC_GRAPH_KVCACHE_URL (or _ADDR) names it"
        )
    if isinstance(exc, WireTimeout):
        check = (
            "; engine_status (tool) or `graph-kvcache-mcp engine status` shows whether it runs"
            if ours
            else ""
        )
        return (
            f"{where} timed out after {exc.budget_s:g} s ({exc}): the engine may be hung or "
            f"overloaded; if it is only slow, raise EPISTEMIC_GRAPH_KVCACHE_TIMEOUT_S{check}"
        )
    return f"{where} failed: {exc}"


def explain_status(
    response: WireResponse, url: str, token_given: bool, token_file: Path | None = None
) -> str:
    """A reason for an unexpected status that says what to do; never echoes the token.

    `token_file`: where a managed engine's token lives (a 401 then names it, not the variable).
    """
    message = ""
    if response.content_type.startswith("application/json"):
        try:
            message = str(json.loads(response.body).get("message", ""))[:200]
        except (ValueError, AttributeError):
            message = ""
    if response.status == 401 and token_file is not None:
        return (
            f"managed engine at {url} refused the bearer token (401): its token is in "
            f"{token_file} (0600), which no longer matches the running engine (replaced while it "
            "ran?); restart it (`graph-kvcache-mcp engine stop`, then `engine start`) so both "
            "use the file's token"
        )
    if response.status == 401:
        fix = (
            f"set {KV_TOKEN_ENV} to the engine's token"
            if not token_given
            else f"{KV_TOKEN_ENV} does not match the engine's token"
        )
        return f"engine at {url} refused the bearer token (401): {fix}"
    if response.status == 400:
        return (
            f"engine at {url} refused the request as malformed (400 {message or 'bad request'}); "
            f"check the key and that the value is within {MAX_VALUE_BYTES:,} bytes (the engine "
            f"also refuses a request it has not fully received within "
            f"{ENGINE_REQUEST_DEADLINE_S:g} s)"
        )
    if response.status >= 500:
        return f"engine at {url} failed ({response.status} {message or 'server error'})"
    return f"engine at {url} answered {response.status} {message}".rstrip()
