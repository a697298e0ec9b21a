"""`graph-kvcache-mcp engine start|stop|status`: the managed local engine."""

from __future__ import annotations

import argparse
from pathlib import Path

from graph_kvcache_mcp.commands._common import (
    EXIT_OK,
    EXIT_UNAVAILABLE,
    common_options,
    emit,
    note,
)
from graph_kvcache_mcp.commands._flags import add_flag
from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.state import EngineStatus
from graph_kvcache_mcp.domain.lifecycle import ReadyTimeout, ServicePort, StopWait
from graph_kvcache_mcp.services.stack.store_host import (
    EngineStopOut,
    PublishedEngineStatus,
    StoreJoin,
    published_engine_status,
    start_published_engine,
    stop_published_engine,
)

LISTEN_HELP = (
    "publish it on this host's edge at IP:PORT (mutual TLS; IP one of the certificate's "
    "addresses); needs --tls-dir"
)
TLS_DIR_HELP = "this host's TLS dir (ca.pem, cert.pem, key.pem from `fleet pki issue`)"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    group = subparsers.add_parser("engine", help="manage a local epistemic-graph engine")
    verbs = group.add_subparsers(dest="verb", required=True)
    parent = common_options()

    start = verbs.add_parser("start", parents=[parent], help="start (or reuse) the engine")
    add_flag(start, "--port", ServicePort, help="KV port (default: a free one)")
    start.add_argument(
        "--backend",
        choices=("durable", "memory"),
        default=None,
        help="durable (on disk, the default) or memory (lost on stop)",
    )
    add_flag(
        start,
        "--ready-timeout-s",
        ReadyTimeout,
        default=30.0,
        help="stop it if it does not answer by then (default 30 s)",
    )
    start.add_argument(
        "--resp",
        action="store_true",
        help="also open the engine's RESP wire on a free loopback port (lmcache redis_resp)",
    )
    start.add_argument("--listen", metavar="IP:PORT", help=LISTEN_HELP)
    start.add_argument("--tls-dir", type=Path, help=TLS_DIR_HELP)
    start.set_defaults(handler=run_start)

    stop = verbs.add_parser(
        "stop", parents=[parent], help="stop the engine we started, even while sessions use it"
    )
    add_flag(stop, "--wait-s", StopWait, default=10.0, help="SIGTERM grace before SIGKILL")
    stop.set_defaults(handler=run_stop)

    status = verbs.add_parser(
        "status", parents=[parent], help="is it running and answering; which sessions use it"
    )
    status.set_defaults(handler=run_status)


def run_start(args: argparse.Namespace, settings: Settings) -> int:
    status = start_published_engine(
        settings,
        listen=args.listen,
        tls_dir=args.tls_dir,
        port=args.port,
        backend=args.backend,
        ready_timeout_s=args.ready_timeout_s,
        progress=None if args.json else note,
        resp=args.resp,
    )
    emit(status, as_json=args.json, human=describe_status)
    return EXIT_OK


def run_stop(args: argparse.Namespace, settings: Settings) -> int:
    result = stop_published_engine(settings, wait_s=args.wait_s)
    emit(result, as_json=args.json, human=_describe_stop)
    return EXIT_OK


def run_status(args: argparse.Namespace, settings: Settings) -> int:
    status = published_engine_status(settings)
    emit(status, as_json=args.json, human=describe_status)
    return EXIT_OK if status.reachable else EXIT_UNAVAILABLE


def describe_status(status: EngineStatus) -> str:
    text = _describe_engine(status)
    if isinstance(status, PublishedEngineStatus) and status.join is not None:
        text += "\n" + describe_join(status.join, restarted=status.edge_restarted)
    return text


def describe_join(join: StoreJoin, *, restarted: bool) -> str:
    """What a node operator needs from the store host, one line each."""
    lines = ["published on this host's edge (mutual TLS: peers need a fleet certificate)"]
    if restarted:
        lines.append("  note            the edge restarted to add the route (connections dropped)")
    lines += [
        f"  {name:<15} {value}" for name, value in join.model_dump().items() if name != "token_file"
    ]
    if join.token_file is not None:
        lines.append(f"  token_file      {join.token_file} (copy it to each node privately)")
    flags = []
    if join.engine_url is not None:
        flags.append(f"--engine-url {join.engine_url} --engine-token-file COPY_OF_TOKEN_FILE")
    if join.coordinator_url is not None:
        flags.append(f"--coordinator {join.coordinator_url}")
    flags.append(f"--store-name {join.tls_name}")
    lines.append(f"  a node joins    vllm start ... {' '.join(flags)} --listen N:P --tls-dir DIR")
    return "\n".join(lines)


def _describe_engine(status: EngineStatus) -> str:
    if not status.running:
        return f"engine: not running ({status.reason})"
    health = "answering" if status.reachable else f"NOT answering: {status.reason}"
    reused = " (already running, reused)" if status.reused else ""
    until = (
        "until `engine stop`" if status.runs_until_stop else "until the last session using it exits"
    )
    sessions = ", ".join(f"pid {lease.pid}" for lease in status.leases) or "none"
    resp = f"  resp     {status.resp_address}\n" if status.resp_address else ""
    return (
        f"engine: running{reused}, {health}\n"
        f"  url      {status.base_url}\n{resp}  backend  {status.backend}\n"
        f"  pid      {status.pid}\n"
        f"  uptime   {status.uptime_s:.1f} s\n  runs     {until}\n  sessions {sessions}\n"
        f"  log      {status.log_path}\n  data dir {status.data_dir}"
    )


def _describe_stop(result: EngineStopOut) -> str:
    if not result.stopped:
        return f"engine: nothing to stop for {result.data_dir}"
    edge = f"\n  {result.edge}" if result.edge else ""
    return f"engine: stopped pid {result.pid} ({result.how}){edge}"
