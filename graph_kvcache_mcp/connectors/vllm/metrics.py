"""Scrape a vLLM server's Prometheus `/metrics` and turn it into a `MetricsSnapshot`.

The URL is derived from the OpenAI base URL (`http://host:port/v1` → `http://host:port/metrics`)
or given; plain http only to loopback, https anywhere (`domain.endpoints`). The body is read up to
a cap, so a runaway exposition cannot eat the server's memory. Down reads as `Unavailable`, never
as an empty snapshot.
"""

from __future__ import annotations

import time

import anyio
import anyio.to_thread
import httpx2

from graph_kvcache_mcp.connectors.vllm import errors as vllm_errors
from graph_kvcache_mcp.domain.endpoints import parse_http_url
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.domain.vllm.metrics import MetricsSnapshot, parse_snapshot

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
DEFAULT_TIMEOUT_S = 120.0  # the whole scrape; GRAPH_KVCACHE_VLLM_TIMEOUT_S through VllmClient


class VllmMetricsClient:
    """Reads one server's `/metrics` through a shared `httpx2.AsyncClient` (not owned here)."""

    def __init__(
        self,
        http: httpx2.AsyncClient,
        metrics_url: str,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        headers: dict[str, str] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.metrics_url = parse_http_url(metrics_url, what="vLLM metrics URL").url
        self.timeout_s = timeout_s
        self._http = http
        self._max_body_bytes = max_body_bytes
        self._headers = headers or {}

    def __repr__(self) -> str:
        return f"VllmMetricsClient({self.metrics_url!r})"

    async def scrape_text(self) -> str | Unavailable:
        """The exposition text, or why it could not be read (within `timeout_s`)."""
        try:
            with anyio.fail_after(self.timeout_s):
                return await self._read()
        except TimeoutError:
            return vllm_errors.timed_out(self.metrics_url, self.timeout_s)
        except httpx2.HTTPError as exc:
            return vllm_errors.from_transport(exc, self.metrics_url, self.timeout_s)

    async def _read(self) -> str | Unavailable:
        async with self._http.stream("GET", self.metrics_url, headers=self._headers) as reply:
            if reply.status_code != 200:
                return Unavailable(
                    f"{self.metrics_url} answered HTTP {reply.status_code}; is this a vLLM "
                    "server (it serves /metrics unless started with --disable-log-stats)?",
                    status=reply.status_code,
                )
            body = bytearray()
            async for chunk in reply.aiter_bytes():
                body += chunk
                if len(body) > self._max_body_bytes:
                    return Unavailable(
                        f"{self.metrics_url} sent more than {self._max_body_bytes:,} bytes; "
                        "refusing to parse it (raise max_body_bytes if this is expected)"
                    )
        return body.decode("utf-8", errors="replace")

    async def snapshot(self, model_name: str | None = None) -> MetricsSnapshot | Unavailable:
        """The snapshot for `model_name` (None: all models summed).

        Raises:
            UnknownModel: the server reports no series for `model_name`.
        """
        text = await self.scrape_text()
        if isinstance(text, Unavailable):
            return text
        scraped_at = time.time()
        try:
            snapshot = await anyio.to_thread.run_sync(parse_snapshot, text, model_name)
        except ValueError as exc:
            return Unavailable(f"{self.metrics_url} is not a Prometheus exposition ({exc})")
        if not snapshot.engines:
            return Unavailable(
                f"{self.metrics_url} answers but reports no vLLM series: not a vLLM server, or "
                "one started with --disable-log-stats"
            )
        return snapshot.model_copy(update={"scraped_at": scraped_at})
