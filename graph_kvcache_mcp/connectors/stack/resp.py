"""The `redis_resp` L2 path against the managed engine: an `lmcache server` whose built-in `resp`
adapter stores into the engine's RESP wire.

That adapter connects once, when the server starts, and never reconnects; when the wire does not
answer then, every request that reaches L2 hangs, even after the engine is back. So the server is
started only after the engine's wire has answered AUTH + PING, with the password in the server's
environment (`LMCACHE_RESP_USERNAME` / `LMCACHE_RESP_PASSWORD`, never on its command line), and
the engine process it connected to is recorded so status and diagnosis notice a later restart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.connectors.engine.readiness import resp_ping
from graph_kvcache_mcp.connectors.lmcache.process import DEFAULT_READY_TIMEOUT_S, ManagedLmcache
from graph_kvcache_mcp.connectors.lmcache.state import LmcacheStatus, RespPeer
from graph_kvcache_mcp.domain.lmcache.config import ProcessSpec, point_resp_adapter
from graph_kvcache_mcp.errors import ConfigError, LmcacheProcessError

NO_WIRE = (
    "mode redis_resp stores into the managed engine's RESP wire, and no managed engine with one "
    "runs for {data_dir}: start it with `graph-kvcache-mcp engine start --resp` (engine_start "
    "resp=true) first"
)


@dataclass(frozen=True)
class RespLaunch:
    """The planned server aimed at the engine's wire, its environment with the credentials,
    and the engine process it will connect to."""

    server: ProcessSpec
    env: dict[str, str] = field(repr=False)  # holds the RESP password
    peer: RespPeer


def prepare_resp_launch(
    engine: ManagedEngine, server: ProcessSpec, env: Mapping[str, str]
) -> RespLaunch:
    """Prove `engine`'s RESP wire answers, then aim the planned `redis_resp` server at it.

    Raises:
        LmcacheProcessError: no managed engine with a RESP wire runs, or the wire refuses or
            does not answer (nothing may be started then).
    """
    state = engine.running_state(tidy=False)
    credentials = engine.resp_credentials()
    if state is None or credentials is None:
        raise LmcacheProcessError(NO_WIRE.format(data_dir=engine.data_dir))
    if (why := engine.resp_impostor(state)) is not None:
        raise LmcacheProcessError(f"{why}; the lmcache server was not started")
    failed = resp_ping(credentials.host, credentials.port, credentials.user, credentials.password)
    if failed is not None:
        raise LmcacheProcessError(
            f"{failed.reason}; the lmcache server was not started: its resp adapter would "
            "never reconnect and requests reaching L2 would hang. Check engine_status and start "
            "the engine with resp first"
        )
    try:
        aimed = point_resp_adapter(server, credentials.host, credentials.port)
    except ConfigError as exc:
        raise LmcacheProcessError(str(exc)) from None
    return RespLaunch(
        server=aimed,
        env={
            **env,
            "LMCACHE_RESP_USERNAME": credentials.user,
            "LMCACHE_RESP_PASSWORD": credentials.password.get_secret_value(),
        },
        peer=RespPeer(
            pid=state.process.pid,
            start_ticks=state.process.start_ticks,
            address=f"{credentials.host}:{credentials.port}",
        ),
    )


def start_resp_lmcache(
    engine: ManagedEngine,
    lmcache: ManagedLmcache,
    server: ProcessSpec,
    *,
    env: Mapping[str, str],
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
    runs_until_stop: bool = True,
) -> LmcacheStatus:
    """Start (or reuse) the planned `redis_resp` server against `engine`'s RESP wire, once the
    wire has answered (`prepare_resp_launch`).

    Raises:
        LmcacheProcessError: as `prepare_resp_launch`, or the server's own start failed.
    """
    launch = prepare_resp_launch(engine, server, env)
    return lmcache.start(
        launch.server,
        env=launch.env,
        ready_timeout_s=ready_timeout_s,
        runs_until_stop=runs_until_stop,
        resp_peer=launch.peer,
    )


def restart_resp_lmcache(
    engine: ManagedEngine,
    lmcache: ManagedLmcache,
    *,
    env: Mapping[str, str],
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
) -> LmcacheStatus:
    """Restart the managed `redis_resp` server with the same command, once `engine`'s wire has
    answered: its new adapter connects to the engine that runs now.

    Raises:
        LmcacheProcessError: no resp server of ours runs, the wire does not answer, or it moved
            to another port (start the stack again then).
    """
    state = lmcache.running_state()
    if state is None or state.resp_peer is None:
        raise LmcacheProcessError(
            f"no redis_resp lmcache server started from {lmcache.data_dir} is running"
        )
    recorded = ProcessSpec(argv=["lmcache", *state.wiring.args], env=state.plan_env)
    launch = prepare_resp_launch(engine, recorded, env)
    if launch.server.argv != recorded.argv:
        raise LmcacheProcessError(
            f"the engine's RESP wire is now at {launch.peer.address}, not "
            f"{state.resp_peer.address}: stop the stack (vllm_stop, lmcache_stop) and start it "
            "again with vllm_start kv_connector=redis_resp"
        )
    return lmcache.restart(env=launch.env, ready_timeout_s=ready_timeout_s, resp_peer=launch.peer)
