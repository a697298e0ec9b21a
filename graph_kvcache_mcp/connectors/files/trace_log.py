"""Trace files: append `Trace`s as JSON lines, read a file back for a summary. The only I/O here."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.connectors.files.access import read_regular_file
from graph_kvcache_mcp.domain.vllm.traces import Trace, parse_trace_lines
from graph_kvcache_mcp.errors import InvalidValue

MAX_TRACE_FILE_BYTES = 64 * 1024 * 1024


class TraceFile(BaseModel):
    """The traces of one JSONL file, and which lines were not traces."""

    model_config = ConfigDict(frozen=True)

    path: str
    traces: list[Trace]
    bad_lines: list[int] = Field(description="1-based numbers of lines that were not a Trace.")


def append_traces(path: Path, traces: Iterable[Trace]) -> int:
    """Append each trace as one JSON line (creating the file and its dir); returns lines written."""
    lines = [trace.model_dump_json() + "\n" for trace in traces]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as handle:
        handle.writelines(lines)
    return len(lines)


def read_traces(path: Path, *, max_bytes: int = MAX_TRACE_FILE_BYTES) -> TraceFile:
    """Every trace in a JSONL file (a regular file, read bounded and without blocking).

    Raises:
        FileRefused: missing, not a regular file, or larger than `max_bytes`.
        InvalidValue: not UTF-8 text.
    """
    raw = read_regular_file(path.resolve(), max_bytes=max_bytes)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidValue(f"{path} is not UTF-8 text, so not a JSONL trace file") from None
    traces, bad = parse_trace_lines(text.split("\n"))
    return TraceFile(path=str(path), traces=traces, bad_lines=bad)
