"""`graph-kvcache-mcp edge start|status|stop|rotate`: this host's mutual-TLS edge (haproxy)."""

from __future__ import annotations

import argparse
from pathlib import Path

from graph_kvcache_mcp.commands._common import (
    EXIT_OK,
    EXIT_UNAVAILABLE,
    common_options,
    emit,
)
from graph_kvcache_mcp.commands._flags import add_flag
from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.domain.lifecycle import ReadyTimeout, StopWait
from graph_kvcache_mcp.services import edge
from graph_kvcache_mcp.services.edge import EdgeRotateOut, EdgeStatus, EdgeStopResult

_TLS_HELP = "dir with ca.pem, cert.pem, key.pem (from `fleet pki issue`)"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    group = subparsers.add_parser(
        "edge", help="this host's mutual-TLS edge (haproxy): every hop between hosts"
    )
    verbs = group.add_subparsers(dest="verb", required=True)
    parent = common_options()

    start = verbs.add_parser("start", parents=[parent], help="start (or reuse) the edge")
    start.add_argument("--tls-dir", type=Path, required=True, help=_TLS_HELP)
    start.add_argument(
        "--inbound",
        action="append",
        default=[],
        metavar="MODE:IP:PORT>[IP:]PORT",
        help="listen on the host's address with mutual TLS, forward to loopback "
        "(e.g. http:10.0.0.1:9443>9130; tcp for ZMQ feeds); repeat for several",
    )
    start.add_argument(
        "--outbound",
        action="append",
        default=[],
        metavar="MODE:[IP:]PORT>IP:PORT@NAME",
        help="listen on loopback in the clear, carry to a peer's edge with mutual TLS "
        "(e.g. http:19130>10.0.0.1:9443@store); repeat for several",
    )
    add_flag(
        start,
        "--ready-timeout-s",
        ReadyTimeout,
        default=15.0,
        help="stop it if it is not ready by then (default 15 s)",
    )
    start.set_defaults(handler=run_start)

    status = verbs.add_parser("status", parents=[parent], help="running, listening, served cert")
    status.set_defaults(handler=run_status)

    stop = verbs.add_parser("stop", parents=[parent], help="stop the edge we started")
    add_flag(stop, "--wait-s", StopWait, default=10.0, help="SIGTERM grace before SIGKILL")
    stop.set_defaults(handler=run_stop)

    rotate = verbs.add_parser(
        "rotate", parents=[parent], help="serve a new certificate without a reload"
    )
    rotate.add_argument("--tls-dir", type=Path, required=True, help=_TLS_HELP)
    rotate.set_defaults(handler=run_rotate)


def run_start(args: argparse.Namespace, settings: Settings) -> int:
    status = edge.start(
        settings,
        inbound=args.inbound,
        outbound=args.outbound,
        tls_dir=args.tls_dir,
        ready_timeout_s=args.ready_timeout_s,
    )
    emit(status, as_json=args.json, human=describe_status)
    return EXIT_OK if status.reachable else EXIT_UNAVAILABLE


def run_status(args: argparse.Namespace, settings: Settings) -> int:
    status = edge.edge_status(settings)
    emit(status, as_json=args.json, human=describe_status)
    return EXIT_OK if status.reachable else EXIT_UNAVAILABLE


def run_stop(args: argparse.Namespace, settings: Settings) -> int:
    result = edge.stop(settings, wait_s=args.wait_s)
    emit(result, as_json=args.json, human=_describe_stop)
    return EXIT_OK


def run_rotate(args: argparse.Namespace, settings: Settings) -> int:
    result = edge.rotate(settings, tls_dir=args.tls_dir)
    emit(result, as_json=args.json, human=_describe_rotate)
    return EXIT_OK


def describe_status(status: EdgeStatus) -> str:
    if not status.running:
        return f"edge: not running ({status.reason})"
    health = "listening" if status.reachable else f"NOT ready: {status.reason}"
    reused = " (already running, reused)" if status.reused else ""
    lines = [f"edge: running{reused}, {health}", f"  pid      {status.pid}"]
    if status.restarted:
        lines.append("  note     restarted to add routes: connections through it were dropped")
    if status.routes is not None:
        lines += [
            f"  in       {r.mode} {r.listen_ip}:{r.listen_port} -> {r.target}"
            f"{'' if r.client_certificate == 'required' else ' (no client certificate)'}"
            for r in status.routes.inbound
        ]
        lines += [
            f"  out      {r.mode} {r.listen_ip}:{r.listen_port} -> {r.peer_ip}:{r.peer_port} "
            f"({r.peer_name})"
            for r in status.routes.outbound
        ]
    if status.certificate is not None:
        lines.append(f"  cert     {status.certificate.name}, serial {status.served_serial}")
    lines += [f"  log      {status.log_path}", f"  data dir {status.data_dir}"]
    return "\n".join(lines)


def _describe_stop(result: EdgeStopResult) -> str:
    if not result.stopped:
        return f"edge: nothing to stop for {result.data_dir}"
    return f"edge: stopped pid {result.pid} ({result.how})"


def _describe_rotate(result: EdgeRotateOut) -> str:
    return (
        f"edge: now serving serial {result.served_serial} "
        f"(was {result.previous_serial}), valid until {result.certificate.not_after:%Y-%m-%d}"
    )
