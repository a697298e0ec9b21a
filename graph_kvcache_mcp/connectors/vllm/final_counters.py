"""The last counters of each managed vLLM process, recorded as it is stopped, so a metrics window
across a managed stop or restart counts the traffic of both processes (`domain/vllm/metrics/
window.py`). A record is the process's `/metrics`, cut to the lines a snapshot reads (any model
can be parsed from it later), keyed by the process start time vLLM exports; the newest
`FINALS_KEPT` are kept in `<data dir>/vllm/final-counters.json` (0600).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx2
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from graph_kvcache_mcp.connectors.files.private import read_private, write_private
from graph_kvcache_mcp.domain.vllm.metrics import (
    MetricsSnapshot,
    UnknownModel,
    parse_snapshot,
    relevant_lines,
)
from graph_kvcache_mcp.errors import ConfigError

FILE_NAME = "final-counters.json"
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
    path = home / FILE_NAME
    kept = [r for r in _read(path) if r.process_start_time_s != start]
    try:
        write_private(path, _RECORDS.dump_json([*kept, final][-FINALS_KEPT:]).decode())
    except (OSError, ConfigError):
        return  # the stop matters more than the record; the window is flagged instead


def final_snapshots(data_dir: Path, model: str | None) -> list[MetricsSnapshot]:
    """The recorded last snapshots of the managed vLLM processes of `data_dir`, for `model`."""
    out = []
    for record in _read(data_dir / "vllm" / FILE_NAME):
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
