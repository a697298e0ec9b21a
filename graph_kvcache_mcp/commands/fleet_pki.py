"""`graph-kvcache-mcp fleet pki init|issue`: the fleet's trust root (a CA dedicated to the edges)
and one certificate per host."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path

from graph_kvcache_mcp.commands._common import EXIT_OK, Verbs, common_options, emit
from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.files import pki
from graph_kvcache_mcp.domain.edge.pki import CaSummary, HostCertificate, HostRequest


def register(fleet_verbs: Verbs) -> None:
    group = fleet_verbs.add_parser(
        "pki", help="the fleet's trust root: a CA for the edges and one certificate per host"
    )
    verbs = group.add_subparsers(dest="pki_verb", required=True)
    parent = common_options()

    init = verbs.add_parser("init", parents=[parent], help="make the fleet CA (never overwritten)")
    init.add_argument("--dir", type=Path, required=True, help="the PKI dir (created 0700)")
    init.set_defaults(handler=run_init)

    issue = verbs.add_parser(
        "issue", parents=[parent], help="issue a host certificate (server and client use)"
    )
    issue.add_argument("--dir", type=Path, required=True, help="the PKI dir holding the CA")
    issue.add_argument("--name", required=True, help="the host's name (a DNS name: node-2)")
    issue.add_argument(
        "--ip",
        action="append",
        default=[],
        help="an address the host's edge listens on (repeat for several)",
    )
    issue.add_argument(
        "--out", type=Path, required=True, help="where to write ca.pem, cert.pem, key.pem (0600)"
    )
    issue.set_defaults(handler=run_issue)


def run_init(args: argparse.Namespace, _settings: Settings) -> int:
    summary = pki.init_ca(args.dir, now=datetime.now(UTC))
    emit(summary, as_json=args.json, human=_describe_ca)
    return EXIT_OK


def run_issue(args: argparse.Namespace, _settings: Settings) -> int:
    request = HostRequest.of(args.name, args.ip)
    issued = pki.issue(args.dir, request, args.out, now=datetime.now(UTC))
    emit(issued, as_json=args.json, human=_describe_host)
    return EXIT_OK


def _describe_ca(summary: CaSummary) -> str:
    return (
        f"fleet CA made in {summary.directory}\n"
        f"  certificate {summary.ca_certificate} (copy it to every host; keep ca.key here)\n"
        f"  sha256      {summary.fingerprint_sha256}\n"
        f"  valid until {summary.not_after:%Y-%m-%d}"
    )


def _describe_host(issued: HostCertificate) -> str:
    return (
        f"certificate for {issued.name} ({', '.join(issued.addresses)}) in {issued.directory}\n"
        f"  serial      {issued.serial}\n"
        f"  valid until {issued.not_after:%Y-%m-%d}\n"
        f"  CA sha256   {issued.ca_fingerprint_sha256}"
    )
