"""Routes added to a running edge (real haproxy): reused when carried, restarted with the union
otherwise (said in the result), a listener clash or another TLS dir refused with the edge left
as it was, and routes withdrawn until the edge stops."""

from __future__ import annotations

from pathlib import Path

import pytest

from graph_kvcache_mcp.connectors.edge.process import ManagedEdge
from graph_kvcache_mcp.connectors.processes.identity import listener_owner
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.domain.edge.routes import Inbound, Route, routes_of
from graph_kvcache_mcp.errors import ConfigError, InvalidValue
from tests.support.fleet_tls import make_fleet_tls, require_haproxy


def test_routes_added_by_two_commands_end_on_one_edge(tmp_path: Path) -> None:
    require_haproxy()
    tls = make_fleet_tls(tmp_path / "tls")
    engine_in, coordinator_in, callback = free_port(), free_port(), free_port()
    engine = routes_of([f"http:127.0.0.1:{engine_in}>9130"], [])
    coordinator = routes_of(
        [f"http:127.0.0.1:{coordinator_in}>9300"],
        [f"http:127.0.0.2:{callback}>127.0.0.1:{free_port()}@node"],
    )
    edge = ManagedEdge(tmp_path / "store")
    try:
        first = edge.ensure(engine, tls.store)
        assert (first.reachable, first.restarted, first.reused) == (True, False, False)
        again = edge.ensure(engine, tls.store)
        assert (again.reused, again.restarted, again.pid) == (True, False, first.pid)

        both = edge.ensure(coordinator, tls.store)
        assert (both.reachable, both.restarted) == (True, True)
        assert both.pid != first.pid
        assert both.routes is not None and both.routes.carries(engine)
        assert both.routes.carries(coordinator)
        for host, port in both.routes.listeners():
            assert listener_owner(both.pid or -1, port, group=True, host=host) == "ours"

        clash = routes_of([f"http:127.0.0.1:{engine_in}>9999"], [])
        with pytest.raises(InvalidValue, match="cannot also carry"):
            edge.ensure(clash, tls.store)
        with pytest.raises(ConfigError, match="runs with the TLS dir"):
            edge.ensure(routes_of([f"http:127.0.0.1:{free_port()}>1"], []), tls.store_next)
        assert edge.status().pid == both.pid  # refusals leave the running edge alone

        def to_engine(route: Route) -> bool:
            return isinstance(route, Inbound) and route.target_port == 9130

        fewer = edge.withdraw(to_engine)
        assert fewer is not None and fewer.restarted and fewer.routes is not None
        assert fewer.routes.all() == coordinator.all()
        assert listener_owner(-1, engine_in, host="127.0.0.1") == "none"
        assert edge.withdraw(to_engine) is None  # nothing of the engine left: untouched

        gone = edge.withdraw(lambda route: True)
        assert gone is not None and not gone.running
        assert edge.running_state() is None
    finally:
        edge.stop(term_wait_s=5)
