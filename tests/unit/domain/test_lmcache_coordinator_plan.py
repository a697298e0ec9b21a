"""The managed coordinator's plan: loopback, the servers' chunk size and hash, state files in the
given dir; joining a server adds the three flags once and never to a second coordinator."""

from __future__ import annotations

from pathlib import Path

import pytest

from graph_kvcache_mcp.domain.lmcache.coordinator_plan import (
    check_agreement,
    coordinator_spec,
    join_coordinator,
    joined_url,
)
from graph_kvcache_mcp.domain.lmcache.process_spec import ProcessSpec
from graph_kvcache_mcp.errors import ConfigError

SERVER = ProcessSpec(argv=["lmcache", "server", "--chunk-size", "128"], env={})
URL = "http://127.0.0.1:9300"


def test_the_coordinator_binds_loopback_and_keeps_its_state_in_the_data_dir() -> None:
    spec = coordinator_spec(port=9300, state_dir=Path("/d/coord"), chunk_size=128)
    assert spec.argv[:6] == ["lmcache", "coordinator", "--host", "127.0.0.1", "--port", "9300"]
    assert "--checkpoint-path /d/coord/checkpoint.json" in " ".join(spec.argv)
    assert "--metadata-path /d/coord/metadata.json" in " ".join(spec.argv)
    assert spec.env["LMCACHE_TRACK_USAGE"] == "false"
    check_agreement(SERVER, spec)


def test_a_coordinator_that_hashes_differently_is_refused() -> None:
    with pytest.raises(ConfigError, match="--chunk-size 256 differs"):
        check_agreement(SERVER, coordinator_spec(port=1, state_dir=Path("/d")))


def test_joining_adds_the_flags_once() -> None:
    joined = join_coordinator(SERVER, URL)
    assert joined.argv[4:] == [
        "--coordinator-url",
        URL,
        "--coordinator-event-reporting",
        "--coordinator-advertise-ip",
        "127.0.0.1",
    ]
    assert join_coordinator(joined, URL) == joined
    assert joined_url(joined) == URL and joined_url(SERVER) is None


def test_a_server_joins_one_coordinator_only() -> None:
    with pytest.raises(ConfigError, match="already joined"):
        join_coordinator(join_coordinator(SERVER, URL), "http://127.0.0.1:9400")
