"""The MP stack's coordinator: the server joined to the managed coordinator (started or reused
with the server's own chunk size and hash) or to the one its options name."""

from __future__ import annotations

from pathlib import Path

from graph_kvcache_mcp.connectors.lmcache.coordinator_process import ManagedCoordinator
from graph_kvcache_mcp.domain.endpoints import approve_http_url
from graph_kvcache_mcp.domain.lmcache.coordinator_plan import flag_value, join_coordinator
from graph_kvcache_mcp.domain.lmcache.process_spec import ProcessSpec

MANAGED = "managed"


def joined_server(
    server: ProcessSpec, coordinator: str | None, *, data_dir: Path, python: Path | str | None
) -> ProcessSpec:
    """`server` joined to `coordinator` ('managed' or a URL); unchanged when None. Blocks while
    the managed coordinator starts (call it from a worker thread in async code).

    Raises:
        ConfigError: a URL the policy refuses, or a server already joined elsewhere.
        LmcacheProcessError: the managed coordinator runs with another hash, or did not start.
    """
    if coordinator is None:
        return server
    if coordinator != MANAGED:
        endpoint = approve_http_url(coordinator, what="LMCache coordinator URL")
        return join_coordinator(server, endpoint.url.rstrip("/"))
    managed = ManagedCoordinator(data_dir, python=python)
    chunk = int(flag_value(server, "--chunk-size", "256"))
    algorithm = flag_value(server, "--hash-algorithm", "blake3")
    state = managed.ensure(chunk_size=chunk, hash_algorithm=algorithm)
    return join_coordinator(server, state.url)
