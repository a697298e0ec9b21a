"""Scrape a vLLM server's Prometheus `/metrics` and turn it into a `MetricsSnapshot`.

The URL is derived from the OpenAI base URL (`http://host:port/v1` → `http://host:port/metrics`)
or given; plain http only to loopback, https anywhere (`domain.endpoints`). The body is read up to
a cap, so a runaway exposition cannot eat the server's memory. Down reads as `Unavailable`, never
as an empty snapshot.

The managed vLLM's last counters are kept here too, as it is stopped, so a metrics window across
a managed stop or restart counts the traffic of both processes (`domain/vllm/metrics/window.py`).
A record is the process's `/metrics`, cut to the lines a snapshot reads (any model can be parsed
from it later), keyed by the process start time vLLM exports; the newest `FINALS_KEPT` are kept in
`<data dir>/vllm/final-counters.json` (0600).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import anyio
import anyio.to_thread
import httpx2
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from graph_kvcache_mcp.connectors.files.private import read_private, write_private
from graph_kvcache_mcp.connectors.vllm import errors as vllm_errors
from graph_kvcache_mcp.domain.endpoints import parse_http_url
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.domain.vllm.deadlines import DEFAULT_PROBE_TIMEOUT_S, PROBE_TIMEOUT_ENV
from graph_kvcache_mcp.domain.vllm.metrics import (
    MetricsSnapshot,
    UnknownModel,
    parse_snapshot,
    relevant_lines,
)
from graph_kvcache_mcp.errors import ConfigError

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
DEFAULT_TIMEOUT_S = DEFAULT_PROBE_TIMEOUT_S  # the whole scrape; PROBE_TIMEOUT_ENV via VllmClient
INLINE_PARSE_CHARS = 512 * 1024
"""Expositions up to this size are parsed on the event loop: one server's (~60 KB) parses in
~1 ms, less than the hop to a worker thread and back costs while a chat call waits on it; a
larger one (many models, a proxy's aggregate) goes to a thread so other calls keep moving."""


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
        trusted: str | None = None,
    ) -> None:
        """`trusted`: the CAs `http` was given (a fleet's), named in a certificate failure."""
        self.metrics_url = parse_http_url(metrics_url, what="vLLM metrics URL").url
        self._trusted = trusted
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
            return vllm_errors.timed_out(self.metrics_url, self.timeout_s, knob=PROBE_TIMEOUT_ENV)
        except httpx2.HTTPError as exc:
            return vllm_errors.from_transport(
                exc,
                self.metrics_url,
                self.timeout_s,
                knob=PROBE_TIMEOUT_ENV,
                trusted=self._trusted,
            )

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
            if len(text) <= INLINE_PARSE_CHARS:
                snapshot = parse_snapshot(text, model_name)
            else:
                snapshot = await anyio.to_thread.run_sync(parse_snapshot, text, model_name)
        except ValueError as exc:
            return Unavailable(f"{self.metrics_url} is not a Prometheus exposition ({exc})")
        if not snapshot.engines:
            return Unavailable(
                f"{self.metrics_url} answers but reports no vLLM series: not a vLLM server, or "
                "one started with --disable-log-stats"
            )
        return snapshot.model_copy(update={"scraped_at": scraped_at})


# --- the managed vLLM's final counters ----------------------------------------------------

FINALS_FILE = "final-counters.json"
FINALS_KEPT = 16
SCRAPE_TIMEOUT_S = 3.0
"""A stop waits at most this long for the last scrape (a hung server is stopped regardless)."""


class FinalCounters(BaseModel):
    """One stopped process's last scrape."""

    model_config = ConfigDict(frozen=True)

    process_start_time_s: float
    stopped_at: float
    exposition: str


_RECORDS = TypeAdapter(list[FinalCounters])


def record_final_counters(home: Path, port: int) -> None:
    """Scrape the managed vLLM on `port` once more and keep its counters; a server that does
    not answer (or exports no start time) leaves no record, and the stop goes on. The caller
    holds the lifecycle lock, so two stops never write the file at once."""
    try:
        reply = httpx2.get(f"http://127.0.0.1:{port}/metrics", timeout=SCRAPE_TIMEOUT_S)
    except httpx2.HTTPError:
        return
    if reply.status_code != 200:
        return
    exposition = relevant_lines(reply.text, None)
    try:
        start = parse_snapshot(exposition).process_start_time_s
    except ValueError:
        return
    if start is None:
        return
    final = FinalCounters(process_start_time_s=start, stopped_at=time.time(), exposition=exposition)
    path = home / FINALS_FILE
    kept = [r for r in _read(path) if r.process_start_time_s != start]
    try:
        write_private(path, _RECORDS.dump_json([*kept, final][-FINALS_KEPT:]).decode())
    except (OSError, ConfigError):
        return  # the stop matters more than the record; the window is flagged instead


def final_snapshots(data_dir: Path, model: str | None) -> list[MetricsSnapshot]:
    """The recorded last snapshots of the managed vLLM processes of `data_dir`, for `model`."""
    out = []
    for record in _read(data_dir / "vllm" / FINALS_FILE):
        try:
            out.append(parse_snapshot(record.exposition, model))
        except (UnknownModel, ValueError):
            continue
    return out


def _read(path: Path) -> list[FinalCounters]:
    try:
        text = read_private(path)
    except (OSError, ConfigError):
        return []
    if text is None:
        return []
    try:
        return _RECORDS.validate_python(json.loads(text))
    except (ValueError, ValidationError):
        return []  # a torn or foreign file: the windows it would help are flagged instead
