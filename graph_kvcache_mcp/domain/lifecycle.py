"""The bounds every managed process shares: its port, how long it may take to start, how long it
gets to stop. Declared once here; the domain models, the tool signatures and the CLI flags all use
these types, so a bound cannot differ between them. Pure: no I/O.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

ServicePort = Annotated[int, Field(ge=1024, le=65535)]
"""A loopback port a process we start binds: unprivileged, so 1024 and up."""

ReadyTimeout = Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False)]
"""Seconds a process may take to answer healthy before it is stopped again."""

StopWait = Annotated[float, Field(gt=0, le=120, allow_inf_nan=False)]
"""Seconds between SIGTERM and SIGKILL."""

LogLines = Annotated[int, Field(ge=1, le=500)]
"""How many last lines of a managed process's log to return."""
