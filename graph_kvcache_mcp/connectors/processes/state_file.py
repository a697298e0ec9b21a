"""The state file where a manager records the process it started (0600, written atomically)."""

from __future__ import annotations

from pathlib import Path
from typing import Generic, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from graph_kvcache_mcp.connectors.files.private import read_private, write_private
from graph_kvcache_mcp.connectors.processes.identity import ProcessRecord, is_ours


class ProcessState(BaseModel):
    """Base of a state file's model: the process we started, plus what its manager adds."""

    model_config = ConfigDict(frozen=True)

    process: ProcessRecord


StateT = TypeVar("StateT", bound=ProcessState)


class StateFile(Generic[StateT]):
    """The JSON file (0600) where a manager records the process it started, read back as `model`.

    The path is read on every call, so a record written or removed by another process (or a
    test) is seen at once.
    """

    def __init__(self, path: Path, model: type[StateT]) -> None:
        self.path = path
        self.model = model

    def read(self) -> StateT | None:
        """The recorded state, when the file exists and is readable.

        Raises:
            ConfigError: the state file is a symbolic link.
        """
        try:
            text = read_private(self.path)
        except OSError:
            return None
        if text is None:
            return None
        try:
            return self.model.model_validate_json(text)
        except ValidationError:
            return None

    def read_live(self, *, tidy: bool = True) -> StateT | None:
        """The recorded state when its process is still the one we started; a stale record is
        removed when `tidy` (read-only callers leave it)."""
        state = self.read()
        if state is None:
            return None
        if is_ours(state.process):
            return state
        if tidy:
            self.clear()
        return None

    def write(self, state: StateT) -> None:
        write_private(self.path, state.model_dump_json(indent=2))

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)
