"""How far an L1 answer from LMCache's coordinator can be trusted. Pure: no I/O, no clock.

The coordinator's directory is only as complete as the events it received. Three things make it
wrong without saying so, and each is detected from what the processes export:

- **A coordinator younger than the server** (it restarted after the server started): what the
  server stored before comes back only from the coordinator's checkpoint (without one the
  directory starts empty and is never re-announced), and what the server reported while the
  coordinator was down is lost (LMCache has no replay; its gate only logs the sequence gap). The
  directory's answer is then a lower bound: marked untrusted. Both start times are the processes'
  own `process_start_time_seconds` on their `/metrics`.
- **A server killed less than the coordinator's instance timeout ago** (30 s, checked every 10 s):
  its registration and L1 placements linger. A new server at the same address registers under a
  new id; a registration older than this server's start is its predecessor's, never its own.
- **A gap in the vLLM feed** is the fleet index's own freshness (`domain/fleet/freshness.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict

from graph_kvcache_mcp.domain.vllm.metrics.names import PROCESS_START

REPORTED_INSTANCE_ROUTE = "/graph_kvcache/instance"
"""Where a server started through our entry point (`plugins/lmcache/server.py`) tells its owner
the id it registers under at the coordinator (`{"instance_id": ...}`); other servers answer 404."""
INSTANCE_TIMEOUT_S = 40.0
"""The coordinator's instance timeout (30 s) plus its health-check period (10 s): how long a
killed server's registration and L1 placements may linger."""
START_SLACK_S = 2.0
"""Clock slack between two processes' start times and a registration time (same host)."""


class Registration(BaseModel):
    """One server process as the coordinator's `GET /instances` lists it."""

    model_config = ConfigDict(frozen=True)

    instance_id: str
    registered_at: float | None = None


class Predecessor(BaseModel):
    """Only an earlier process at the server's address is registered (killed or stopped less
    than the instance timeout ago); the running one has not registered yet."""

    model_config = ConfigDict(frozen=True)

    instance_id: str


def process_start_s(exposition: str) -> float | None:
    """`process_start_time_seconds` from a Prometheus exposition; None when it is not there."""
    for line in exposition.splitlines():
        if line.startswith(PROCESS_START + " "):
            try:
                return float(line.split()[1])
            except (IndexError, ValueError):
                return None
    return None


def own_registration(
    registrations: Sequence[Registration],
    server_started_s: float | None,
    reported_id: str | None = None,
) -> Registration | Predecessor | None:
    """The running server's registration among those at its address.

    With the id the server reports (`reported_id`), that registration and no other: any local
    user can register at the server's address or delete its registration on a coordinator
    without our filter, so "the newest" could be theirs. Without one (a server not started
    through our entry point), the newest, unless every one predates the server's start (then
    the newest is a predecessor's). None: not registered."""
    if reported_id is not None:
        return next((r for r in registrations if r.instance_id == reported_id), None)
    if not registrations:
        return None
    newest = max(registrations, key=lambda r: r.registered_at or 0.0)
    if (
        server_started_s is not None
        and newest.registered_at is not None
        and newest.registered_at < server_started_s - START_SLACK_S
    ):
        return Predecessor(instance_id=newest.instance_id)
    return newest


def l1_distrust(coordinator_started_s: float | None, server_started_s: float | None) -> str | None:
    """Why the coordinator's L1 answer for this server cannot be trusted; None: it can."""
    if coordinator_started_s is None or server_started_s is None:
        which = "the coordinator" if coordinator_started_s is None else "the LMCache server"
        return (
            f"untrusted: {which} exports no process_start_time_seconds on /metrics, so a "
            "coordinator restart (which loses directory entries) cannot be ruled out"
        )
    if coordinator_started_s <= server_started_s + START_SLACK_S:
        return None
    return (
        f"untrusted: the coordinator started at {_utc(coordinator_started_s)}, after this "
        f"server (at {_utc(server_started_s)}): its directory holds only what its checkpoint "
        "restored (none without --checkpoint-path) and what the server reported since; stores "
        "reported while it was down are lost. Held chunks may read as missing (a lower bound)"
    )


def unmanaged_distrust(coordinator_url: str) -> str:
    """Why the L1 answer of a coordinator we did not start is not trusted by default."""
    return (
        f"untrusted: the coordinator at {coordinator_url} was not started from this data dir, "
        "so nothing filters who writes to it (LMCache's own has no authentication: any local "
        "user can post store events, register or delete servers there); set "
        "GRAPH_KVCACHE_TRUST_UNMANAGED_COORDINATOR=1 to trust it"
    )


def predecessor_reason(server_url: str, stale: Predecessor) -> str:
    return (
        f"unknown: the coordinator still lists only an earlier process at {server_url} "
        f"({stale.instance_id}, stopped or killed less than its {INSTANCE_TIMEOUT_S:.0f} s "
        "instance timeout ago); the running server has not registered yet: ask again shortly"
    )


def _utc(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%H:%M:%SZ")
