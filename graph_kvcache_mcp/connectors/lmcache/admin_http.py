"""`lmcache server`'s HTTP admin API: `/healthcheck`, `/status` (L2 adapter health),
`/lmc_version`, `/config` (how it keys chunks, how it is wired) and `/metrics` (its lookup and L2
counters). The API has no auth; only loopback or listed hosts are accepted (parse_http_url).
"""

from __future__ import annotations

from typing import Any, Self

import httpx2
from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.connectors.net.tls_trust import ClientTls
from graph_kvcache_mcp.domain.endpoints import parse_http_url
from graph_kvcache_mcp.domain.fleet.tier_trust import REPORTED_INSTANCE_ROUTE, process_start_s
from graph_kvcache_mcp.domain.fleet.tiers import ServerKeying, keying_from_config
from graph_kvcache_mcp.domain.lmcache.metrics import LmcacheCounters, parse_lmcache_counters
from graph_kvcache_mcp.domain.lmcache.status import LmcacheServerReport, report_from_status
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.domain.vllm.wiring import ReportedLmcacheWiring, reported_wiring


class LmcacheHealth(BaseModel):
    """What the server says about itself."""

    model_config = ConfigDict(frozen=True)

    healthy: bool
    version: str | None = None
    unhealthy_l2: list[str] = Field(
        default_factory=list, description="Type of each L2 adapter reporting is_healthy=false."
    )
    report: LmcacheServerReport = Field(
        default_factory=LmcacheServerReport, description="From GET /status."
    )


class LmcacheHttp:
    """One `lmcache server` HTTP API (its --http-port). Use as `async with`."""

    def __init__(
        self, http_url: str, *, timeout_s: float = 5.0, tls: ClientTls | None = None
    ) -> None:
        """`tls`: a fleet's mutual-TLS context, for a server on another host."""
        self.http_url = parse_http_url(http_url, what="LMCache HTTP URL").url.rstrip("/")
        self._http = httpx2.AsyncClient(
            timeout=httpx2.Timeout(timeout_s), verify=True if tls is None else tls.context
        )

    def __repr__(self) -> str:
        return f"LmcacheHttp({self.http_url!r})"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def status(self) -> LmcacheHealth | Unavailable:
        """Health, version and unhealthy L2 adapters, or why the server did not answer."""
        health = await self._get("/healthcheck")
        if isinstance(health, Unavailable):
            return health
        status = await self._get("/status")
        version = await self._get("/lmc_version")
        report = report_from_status(status if isinstance(status, dict) else {})
        unhealthy = [
            str(adapter.detail.get("type", f"adapter {adapter.index}"))
            for adapter in report.l2_adapters
            if adapter.healthy is False
        ]
        return LmcacheHealth(
            healthy=isinstance(health, dict) and health.get("status") == "healthy",
            version=None if isinstance(version, Unavailable) else str(version),
            unhealthy_l2=unhealthy,
            report=report,
        )

    async def keying(self) -> ServerKeying | Unavailable:
        """How the server names chunks and where its engine L2 is (GET /config)."""
        config = await self._get("/config")
        if isinstance(config, Unavailable):
            return config
        return keying_from_config(config if isinstance(config, dict) else {})

    async def reported_wiring(self) -> ReportedLmcacheWiring | Unavailable:
        """Its transfer mode, RPC port and L2 engine as it reports them (GET /config)."""
        config = await self._get("/config")
        if isinstance(config, Unavailable):
            return config
        return reported_wiring(config if isinstance(config, dict) else {})

    async def counters(self) -> LmcacheCounters | Unavailable:
        """The server's lookup and L2 counters from `/metrics`, or why it did not answer."""
        text = await self.metrics_text()
        if isinstance(text, Unavailable):
            return text
        try:
            return parse_lmcache_counters(text)
        except ValueError as exc:
            return Unavailable(f"LMCache /metrics at {self.http_url} did not parse ({exc})")

    async def metrics_text(self) -> str | Unavailable:
        """The server's whole `/metrics` exposition, or why it did not answer."""
        try:
            reply = await self._http.get(self.http_url + "/metrics")
        except httpx2.HTTPError as exc:
            return Unavailable(f"LMCache /metrics not reachable at {self.http_url} ({exc!r})")
        if reply.status_code != 200:
            return Unavailable(
                f"LMCache at {self.http_url} answered HTTP {reply.status_code} on /metrics",
                status=reply.status_code,
            )
        return reply.text

    async def instance_id(self) -> str | None:
        """The id the server says it registers under at its coordinator (a server started
        through our entry point tells its owner); None when it says none or cannot be asked."""
        answer = await self._get(REPORTED_INSTANCE_ROUTE)
        found = answer.get("instance_id") if isinstance(answer, dict) else None
        return found if isinstance(found, str) and found else None

    async def started_s(self) -> float | None:
        """When the server process started (its /metrics); None when it does not say."""
        try:
            reply = await self._http.get(self.http_url + "/metrics")
        except httpx2.HTTPError:
            return None
        return process_start_s(reply.text) if reply.status_code == 200 else None

    async def _get(self, path: str) -> Any:
        try:
            reply = await self._http.get(self.http_url + path)
        except httpx2.HTTPError as exc:
            return Unavailable(
                f"LMCache not reachable at {self.http_url} ({type(exc).__name__}); start "
                "`lmcache server` or check its --http-port"
            )
        if reply.status_code != 200:
            return Unavailable(
                f"LMCache at {self.http_url} answered HTTP {reply.status_code} on {path}",
                status=reply.status_code,
            )
        try:
            return reply.json()
        except ValueError:
            return Unavailable(f"LMCache at {self.http_url} sent no JSON on {path}")
