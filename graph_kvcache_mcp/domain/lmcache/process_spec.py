"""One process to run (argv and environment), as a plan hands it out, and the one edit a plan
gets after the fact: aiming its `resp` adapter at the managed engine. Pure: no I/O."""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, computed_field

from graph_kvcache_mcp.errors import ConfigError


class ProcessSpec(BaseModel):
    """One process to run: its argv and the environment it needs (no secret values)."""

    model_config = ConfigDict(frozen=True)

    argv: list[str]
    env: dict[str, str]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def shell(self) -> str:
        """The same as one shell line (env assignments, then the quoted argv)."""
        env = " ".join(f"{name}={_shell_value(value)}" for name, value in self.env.items())
        return f"{env} {shlex.join(self.argv)}" if env else shlex.join(self.argv)


def compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _shell_value(value: str) -> str:
    # "${VAR}" stays expandable; anything else is quoted.
    if value.startswith("${") and value.endswith("}"):
        return f'"{value}"'
    return shlex.quote(value)


L2_ADAPTER_FLAG = "--l2-adapter"


def point_resp_adapter(server: ProcessSpec, host: str, port: int) -> ProcessSpec:
    """`server` with its `resp` L2 adapter aimed at host:port (the managed engine's RESP wire).

    Raises:
        ConfigError: the planned server has no `resp` adapter.
    """
    argv = list(server.argv)
    for index, arg in enumerate(argv[:-1]):
        if arg != L2_ADAPTER_FLAG:
            continue
        adapter = json.loads(argv[index + 1])
        if isinstance(adapter, dict) and adapter.get("type") == "resp":
            argv[index + 1] = compact_json({**adapter, "host": host, "port": port})
            return server.model_copy(update={"argv": argv})
    raise ConfigError("the planned lmcache server has no resp L2 adapter (plan mode redis_resp)")


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value of the first `flag` in `argv` (`--flag value` or `--flag=value`); None
    without one."""
    for index, arg in enumerate(argv):
        if arg == flag and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None
