"""A component we talk to (the engine, vLLM, an lmcache server, a coordinator), resolved once per
call and passed down: either managed here or configured.

*Managed here*: started, leased and stopped from a data dir, its address read from its state
record. *Configured*: named by URL (its credential stays with the connector that talks to it;
one on another host carries its `TlsIdentity`: the fleet CA, our certificate, its name); nothing
here starts or stops it, so a lifecycle verb answers `not_managed_here(...)` instead of probing a
loopback port. Every read (status, metrics, chat, tiers) works on either kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeAlias
from urllib.parse import urlsplit

Component = Literal["engine", "vLLM", "lmcache server", "lmcache coordinator"]
Source = Literal["configured", "managed", "default"]
"""Where a resolved target's address came from: a setting named it (`Configured`), this data
dir's state records it (`ManagedHere`), or neither, so the component's own default address (a
`Configured` no setting named: what to tell a caller differs, e.g. "start the managed one")."""


@dataclass(frozen=True, slots=True)
class ManagedHere:
    """A component this data dir starts and stops; `url` is where it answers (or would)."""

    component: Component
    data_dir: Path
    url: str | None = None


@dataclass(frozen=True, slots=True)
class TlsIdentity:
    """How a component on another host is reached with mutual TLS: `tls_dir` is this host's
    `fleet pki issue` output (ca.pem: the only CA trusted; cert.pem and key.pem: presented), and
    `peer_name` the DNS name its certificate must carry where we cannot check it by address (a
    feed read through the edge); None: an https URL's host is checked against the certificate."""

    tls_dir: Path
    peer_name: str | None = None


@dataclass(frozen=True, slots=True)
class Configured:
    """A component named by URL that something else runs; `tls` when it is reached with the
    fleet's mutual TLS (None: the system's CAs, no client certificate)."""

    component: Component
    url: str
    tls: TlsIdentity | None = None


Target: TypeAlias = ManagedHere | Configured


def not_managed_here(target: Configured) -> str:
    """What a lifecycle verb answers for a component it cannot start or stop."""
    return (
        f"not managed here: {target.url} (a {target.component} this data dir did not start; "
        "stop or restart it where it runs)"
    )


def logs_not_readable_here(target: Configured, own_log: Path) -> str:
    """What a log read answers for a component it did not start: its log is written where it
    runs, by whatever started it, so nothing here can read it (and this data dir's own log is of
    another process)."""
    return (
        f"{not_managed_here(target)}; the log of a {target.component} this data dir did not "
        f"start is not readable from here: read it on {_host(target)}, where it runs (the output "
        f"of whatever started it: its terminal, journal or container log). A {target.component} "
        f"started here would log to {own_log}"
    )


def facts_not_readable_here(target: Configured, facts: str) -> str:
    """What a read answers for the `facts` (e.g. "PYTHONHASHSEED and log") of a component it did
    not start: they live with its process, where it runs; its own API told the rest."""
    return (
        f"{not_managed_here(target)}; its {facts} are not readable from here: read them on "
        f"{_host(target)}, where it runs"
    )


def _host(target: Configured) -> str:
    return urlsplit(target.url).hostname or target.url
