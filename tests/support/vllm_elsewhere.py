"""A real vLLM that no data dir of ours started: the tiny model served on another loopback
address (127.0.0.2) by `raw_vllm`, as a user would start their own, on a port that is free on
127.0.0.1 too. What the project must treat as a configured target, never as its own.

It publishes KV events on ipc sockets in the test's directory, so the fleet view can follow it.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from graph_kvcache_mcp.domain.vllm.launch import kv_events_config
from tests.support.vllm_raw import raw_vllm

ELSEWHERE_HOST = "127.0.0.2"


@dataclass(frozen=True)
class ElsewhereVllm:
    base_url: str
    host: str
    port: int
    kv_events: str
    kv_events_replay: str


def port_free_on_both(host: str) -> int:
    """A port nothing listens on at `host` nor at 127.0.0.1 (where a wrong probe would look)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
            port: int = probe.getsockname()[1]
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as loopback:
            try:
                loopback.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no port free on both {host} and 127.0.0.1")


@contextmanager
def vllm_elsewhere(work_dir: Path, host: str = ELSEWHERE_HOST) -> Iterator[ElsewhereVllm]:
    """Serve the tiny model on `host` (prefix caching is vLLM's default; usage reports cached
    tokens), its process group stopped after the block."""
    port = port_free_on_both(host)
    feed, replay = f"ipc://{work_dir / 'feed.sock'}", f"ipc://{work_dir / 'replay.sock'}"
    events = json.dumps(kv_events_config(feed, replay))
    flags = ("--enable-prompt-tokens-details", "--kv-events-config", events)
    with raw_vllm(work_dir, *flags, host=host, port=port) as base_url:
        yield ElsewhereVllm(base_url, host, port, feed, replay)
