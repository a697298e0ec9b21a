"""How long each kind of call to vLLM may wait, and the variable that sets it. Pure.

A chat or completion does real work (prefill, decode), so it waits as long as the user allows;
a probe (`/health`, `/metrics`, `/v1/models`) costs vLLM milliseconds, so a server that leaves
one unanswered for seconds is stuck, and saying so at once beats waiting out the chat deadline.
"""

from __future__ import annotations

CALL_TIMEOUT_ENV = "GRAPH_KVCACHE_VLLM_TIMEOUT_S"
"""A chat or completion: its whole answer, or the gap between two chunks of a streamed one."""
PROBE_TIMEOUT_ENV = "GRAPH_KVCACHE_VLLM_PROBE_TIMEOUT_S"
"""A /health probe, a /metrics scrape or a /v1/models listing."""

DEFAULT_CALL_TIMEOUT_S = 120.0
DEFAULT_PROBE_TIMEOUT_S = 5.0


def probe_deadline_s(probe_timeout_s: float, call_timeout_s: float) -> float:
    """A probe's deadline: never longer than the call it may precede (a chat reads /metrics
    first), so a short chat deadline is not outlived by its own probe."""
    return min(probe_timeout_s, call_timeout_s)
