"""Typed outcomes of talking to a store. Pure: no I/O.

A call that reaches a server returns what the server said (`Hit`, `Miss`, `Stored`, `Presence`);
one that does not returns `Unavailable` with a reason. "Down" never reads as "empty".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Literal, TypeAlias, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Hit(Generic[T]):
    """The store had the key; `value` is what it returned."""

    value: T


@dataclass(frozen=True, slots=True)
class Miss:
    """The store answered and does not have the key."""


@dataclass(frozen=True, slots=True)
class Unavailable:
    """The store could not answer. `reason` says what to do next and never holds a secret."""

    reason: str
    status: int | None = None


@dataclass(frozen=True, slots=True)
class Stored:
    """A PUT the store acknowledged.

    `already_present` means the key existed and the engine kept the first value: the bytes of this
    PUT were not stored (only its reference count moved).
    """

    state: Literal["stored_new", "already_present"]

    @property
    def stored_new(self) -> bool:
        return self.state == "stored_new"


@dataclass(frozen=True, slots=True)
class Presence:
    """Whether the store has the key (an answer, not a failure)."""

    present: bool


Outcome: TypeAlias = Hit[T] | Miss | Unavailable
PutOutcome: TypeAlias = Stored | Unavailable
PresenceOutcome: TypeAlias = Presence | Unavailable
