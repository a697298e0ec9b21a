"""What a toolset may ask of the server it registers on, and what a toolset module must offer.

`StrictServer` satisfies `Registrar`, and so does `server.RefusingRegistrar`, which stands in for
it when a toolset's endpoint was refused; each `tools/<area>.py` module satisfies `Toolset`.
mypy checks both (tests/unit/test_toolsets.py binds every toolset module to `Toolset`), so a
toolset that reaches past these methods into the SDK fails the type check, not a user.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from mcp.types import ToolAnnotations

Decorator = Callable[[Callable[..., Any]], Any]


class Registrar(Protocol):
    """The part of the MCP server a toolset uses to register itself."""

    def add_tool(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        title: str | None = None,
        description: str | None = None,
        annotations: ToolAnnotations | None = None,
    ) -> None: ...

    def resource(
        self,
        uri: str,
        *,
        name: str | None = None,
        title: str | None = None,
        description: str | None = None,
        mime_type: str | None = None,
    ) -> Decorator: ...

    def prompt(
        self,
        *,
        name: str | None = None,
        title: str | None = None,
        description: str | None = None,
    ) -> Decorator: ...

    def withhold(self, name: str, reason: str) -> None:
        """Note a tool left out (read-only mode), so calling it says why."""

    def live_state(self) -> object | None:
        """The running lifespan's state as the composition root made it (resources get no
        Context; the toolset knows its type, the runtime does not); None while not running."""


@runtime_checkable
class Toolset(Protocol):
    """A `tools/<area>.py` module: its toolset name and how it registers its tools."""

    TOOLSET: str

    def register(self, server: Registrar, *, read_only: bool) -> None: ...


class ToolsetSwitch(Protocol):
    """What the `toolsets` tool asks of the server: the toolsets it knows and adding one."""

    def catalog(self) -> list[tuple[str, bool, str]]:
        """(name, enabled, one-line summary) of every toolset this server knows."""

    def enable(self, name: str) -> tuple[list[str], str]:
        """Register toolset `name` now; its new tool names and its instructions for a model.

        Raises:
            ValueError: `name` is unknown, or already enabled (the message says which).
        """
