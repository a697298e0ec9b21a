"""`graph-kvcache-mcp lmcache coordinator start|status|stop`: LMCache's coordinator as a managed
service of its own, published on this host's edge for a fleet across hosts (the store host)."""

from __future__ import annotations

import argparse
from pathlib import Path

from graph_kvcache_mcp.commands._common import (
    EXIT_OK,
    EXIT_UNAVAILABLE,
    Verbs,
    common_options,
    emit,
)
from graph_kvcache_mcp.commands._flags import add_flag
from graph_kvcache_mcp.commands.engine import LISTEN_HELP, TLS_DIR_HELP, describe_join
from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.domain.lifecycle import ReadyTimeout, StopWait
from graph_kvcache_mcp.domain.lmcache.chunk_keys import DEFAULT_CHUNK_SIZE, SEED_FREE_HASH
from graph_kvcache_mcp.services.stack.coordinator_service import (
    CoordinatorServiceStatus,
    CoordinatorServiceStop,
    coordinator_service_status,
    start_coordinator_service,
    stop_coordinator_service,
)


def register(verbs: Verbs) -> None:
    group = verbs.add_parser(
        "coordinator",
        help="LMCache's coordinator as a service of its own (the store host's), on loopback "
        "and, with --listen, on this host's edge",
    )
    actions = group.add_subparsers(dest="action", required=True)
    parent = common_options()

    start = actions.add_parser(
        "start", parents=[parent], help="start (or reuse) it; it runs until `coordinator stop`"
    )
    start.add_argument(
        "--chunk-size",
        type=int,
        default=DEFAULT_CHUNK_SIZE,
        help=f"tokens per chunk; the servers' value (default {DEFAULT_CHUNK_SIZE})",
    )
    start.add_argument(
        "--hash-algorithm",
        default=SEED_FREE_HASH,
        help=f"the servers' chunk hash (default {SEED_FREE_HASH})",
    )
    start.add_argument(
        "--python", type=Path, help="the interpreter with LMCache (default: the settings')"
    )
    start.add_argument("--listen", metavar="IP:PORT", help=LISTEN_HELP)
    start.add_argument("--tls-dir", type=Path, help=TLS_DIR_HELP)
    start.add_argument(
        "--node",
        action="append",
        default=[],
        metavar="NAME@IP:PORT",
        help="a node whose lmcache server the coordinator calls back (its certificate name, "
        "address and admin port, as its `vllm start --json` prints); repeat for several; "
        "needs --tls-dir",
    )
    add_flag(
        start,
        "--ready-timeout-s",
        ReadyTimeout,
        default=60.0,
        help="stop it if it does not answer by then (default 60 s)",
    )
    start.set_defaults(handler=run_start)

    status = actions.add_parser(
        "status", parents=[parent], help="running, answering, where it is published"
    )
    status.set_defaults(handler=run_status)

    stop = actions.add_parser(
        "stop", parents=[parent], help="stop it and remove its routes from the edge"
    )
    add_flag(stop, "--wait-s", StopWait, default=10.0, help="SIGTERM grace before SIGKILL")
    stop.set_defaults(handler=run_stop)


def run_start(args: argparse.Namespace, settings: Settings) -> int:
    status = start_coordinator_service(
        settings,
        python=args.python,
        chunk_size=args.chunk_size,
        hash_algorithm=args.hash_algorithm,
        ready_timeout_s=args.ready_timeout_s,
        listen=args.listen,
        tls_dir=args.tls_dir,
        nodes=args.node,
    )
    emit(status, as_json=args.json, human=describe_status)
    return EXIT_OK if status.reachable else EXIT_UNAVAILABLE


def run_status(args: argparse.Namespace, settings: Settings) -> int:
    status = coordinator_service_status(settings)
    emit(status, as_json=args.json, human=describe_status)
    return EXIT_OK if status.reachable else EXIT_UNAVAILABLE


def run_stop(args: argparse.Namespace, settings: Settings) -> int:
    result = stop_coordinator_service(settings, wait_s=args.wait_s)
    emit(result, as_json=args.json, human=_describe_stop)
    return EXIT_OK


def describe_status(status: CoordinatorServiceStatus) -> str:
    if not status.running:
        return f"lmcache coordinator: not running ({status.reason})"
    health = "answering" if status.reachable else f"NOT answering: {status.reason}"
    reused = " (already running, reused)" if status.reused else ""
    until = "until `lmcache coordinator stop`" if status.runs_until_stop else "with its server"
    lines = [
        f"lmcache coordinator: running{reused}, {health}",
        f"  url      {status.url} (this user only)",
        f"  chunks   {status.chunk_size} tokens, {status.hash_algorithm}",
        f"  pid      {status.pid}",
        f"  runs     {until}",
        *(f"  node     {node} (callbacks through the edge)" for node in status.nodes),
        f"  log      {status.log_path}",
    ]
    if status.join is not None:
        lines.append(describe_join(status.join, restarted=status.edge_restarted))
        lines.append(
            "  then            lmcache coordinator start --node <its coordinator_node> "
            "(from the node's `vllm start --json`), once per node"
        )
    return "\n".join(lines)


def _describe_stop(result: CoordinatorServiceStop) -> str:
    if not result.stopped:
        return f"lmcache coordinator: nothing to stop for {result.data_dir}"
    edge = f"\n  {result.edge}" if result.edge else ""
    return f"lmcache coordinator: stopped pid {result.pid} ({result.how}){edge}"
