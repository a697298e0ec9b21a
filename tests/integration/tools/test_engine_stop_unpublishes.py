"""`engine_stop` (the MCP tool) removes the edge's route to the engine it stopped, as `engine stop`
does: a route left to a free loopback port would hand the next listener there the nodes'
requests and token. Real engine, real haproxy."""

from __future__ import annotations

from pathlib import Path

from mcp import Client

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.edge.process import ManagedEdge
from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.domain.edge.routes import routes_of
from graph_kvcache_mcp.server import build_server
from graph_kvcache_mcp.services.stack.views import EngineStatusOut
from tests.support.fleet_tls import make_fleet_tls, require_haproxy
from tests.support.mcp_calls import call_ok


async def test_engine_stop_removes_the_engines_route_and_keeps_the_others(tmp_path: Path) -> None:
    require_haproxy()
    tls = make_fleet_tls(tmp_path / "tls")
    data_dir = tmp_path / "data"
    edge = ManagedEdge(data_dir)
    other = f"http:127.0.0.1:{free_port()}>{free_port()}"
    try:
        settings = Settings.build(data_dir=data_dir, engine_backend="memory")
        async with Client(build_server(settings)) as client:
            started = EngineStatusOut.model_validate(
                await call_ok(client, "engine_start", {"backend": "memory"})
            )
            assert started.port is not None
            published = f"http:127.0.0.1:{free_port()}>{started.port}"
            edge.ensure(routes_of([published, other], []), tls.store)
            await call_ok(client, "engine_stop", {"force": True})
        left = edge.status()
        assert left.running and left.restarted is False
        assert left.routes is not None
        assert [route.spec.split(">")[1] for route in left.routes.all()] == [
            "127.0.0.1:" + other.rsplit(">", 1)[1]
        ]
    finally:
        edge.stop(term_wait_s=5)
        ManagedEngine(data_dir).stop(term_wait_s=5)
