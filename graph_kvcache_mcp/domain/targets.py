"""A component we talk to (the engine, vLLM, an lmcache server, a coordinator), resolved once per
call and passed down: either managed here or configured.

*Managed here*: started, leased and stopped from a data dir, its address read from its state
record. *Configured*: named by URL (its credential and CA stay with the connector that talks to
it); nothing here starts or stops it, so a lifecycle verb answers `not_managed_here(...)` instead
of probing a loopback port. Every read (status, metrics, chat, tiers) works on either kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeAlias

Component = Literal["engine", "vLLM", "lmcache server", "lmcache coordinator"]


@dataclass(frozen=True, slots=True)
class ManagedHere:
    """A component this data dir starts and stops; `url` is where it answers (or would)."""

    component: Component
    data_dir: Path
    url: str | None = None


@dataclass(frozen=True, slots=True)
class Configured:
    """A component named by URL that something else runs."""

    component: Component
    url: str


Target: TypeAlias = ManagedHere | Configured


def not_managed_here(target: Configured) -> str:
    """What a lifecycle verb answers for a component it cannot start or stop."""
    return (
        f"not managed here: {target.url} (a {target.component} this data dir did not start; "
        "stop or restart it where it runs)"
    )
