"""A fleet file's `tls://` feeds on this host's edge (real haproxy): started from the file's
routes on first use, reused after, added to an edge that runs other routes, refused with what to
do when a route of that edge or a neighbour holds a feed's port first."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import anyio
import pytest

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.domain.fleet.feed_routes import feed_routes
from graph_kvcache_mcp.domain.fleet.fleet_file import Fleet, parse_fleet
from graph_kvcache_mcp.errors import ConfigError
from graph_kvcache_mcp.services import edge
from graph_kvcache_mcp.services.fleet.feed_edge import ensure_feed_edge
from tests.support.fleet_tls import make_fleet_tls, require_haproxy


def _fleet(tls_dir: Path) -> Fleet:
    peer = free_port()  # nothing need listen there: the edge connects per client connection
    entry = {
        "name": "node",
        "tls_name": "node",
        "base_url": f"https://127.0.0.1:{free_port()}/v1",
        "kv_events": f"tls://127.0.0.1:{peer}",
        "kv_events_replay": f"tls://127.0.0.1:{peer + 1}",
    }
    text = json.dumps({"tls_dir": str(tls_dir), "instances": [entry]})
    return parse_fleet(text, source="fleet.json")


def test_the_feed_edge_starts_from_the_file_is_reused_merged_and_refuses_what_it_cannot_carry(
    tmp_path: Path,
) -> None:
    require_haproxy()
    tls = make_fleet_tls(tmp_path / "tls")
    settings = Settings.build(data_dir=tmp_path / "operator")
    fleet = _fleet(tls.node)
    wanted = feed_routes(fleet)
    try:
        anyio.run(ensure_feed_edge, settings, fleet)
        first = edge.edge_status(settings)
        assert first.reachable and first.routes is not None
        assert tuple(first.routes.outbound) == wanted.outbound
        anyio.run(ensure_feed_edge, settings, fleet)
        assert edge.edge_status(settings).pid == first.pid  # the same edge, reused

        edge.stop(settings, wait_s=5)
        own_port = free_port()
        other = f"tcp:{own_port}>127.0.0.1:{free_port()}@store"
        edge.start(settings, inbound=[], outbound=[other], tls_dir=tls.node, ready_timeout_s=15)
        anyio.run(ensure_feed_edge, settings, fleet)  # a node's edge: the feeds' routes added
        merged = edge.edge_status(settings)
        assert merged.reachable and merged.routes is not None
        assert set(wanted.outbound) < set(merged.routes.outbound)
        assert own_port in {r.listen_port for r in merged.routes.outbound}  # its own route kept

        edge.stop(settings, wait_s=5)
        clash = f"tcp:{wanted.outbound[0].listen_port}>127.0.0.1:{free_port()}@store"
        edge.start(settings, inbound=[], outbound=[clash], tls_dir=tls.node, ready_timeout_s=15)
        with pytest.raises(ConfigError) as caught:  # its own route on a feed's port
            anyio.run(ensure_feed_edge, settings, fleet)
        assert f"tcp:127.0.0.1:{wanted.outbound[0].listen_port}>" in str(caught.value)

        edge.stop(settings, wait_s=5)
        squatter = socket.create_server(("127.0.0.1", wanted.outbound[0].listen_port))
        with squatter, pytest.raises(ConfigError) as taken:
            anyio.run(ensure_feed_edge, settings, fleet)
        assert "already in use" in str(taken.value)
        assert not edge.edge_status(settings).running
    finally:
        edge.stop(settings, wait_s=5)
