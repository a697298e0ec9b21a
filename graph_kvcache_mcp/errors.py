"""The library's exceptions: a caller's mistake is an exception, the state of the world is a value.

    GraphKvcacheError
     ├── InvalidKey        (also ValueError)  a key the engine would refuse or misread
     ├── InvalidValue      (also ValueError)  a value too large, or bytes that do not decode
     ├── ConfigError       (also ValueError)  a setting that cannot be used as given
     └── ProcessError                         a managed process could not be started or stopped
          ├── EngineProcessError
          ├── VllmProcessError
          └── LmcacheProcessError

Messages name what is wrong and how to fix it, and never contain a secret.
"""

from __future__ import annotations

from pydantic import ValidationError


class GraphKvcacheError(Exception):
    """Base class for every error this package raises on purpose."""


class InvalidKey(GraphKvcacheError, ValueError):
    """A key that breaks one of the engine's key rules (see `domain.keys`)."""

    def __init__(self, key: str, *, rule: str, hint: str) -> None:
        self.key = key
        self.rule = rule
        self.hint = hint
        shown = key if len(key) <= 80 else key[:77] + "..."
        super().__init__(f"invalid key {shown!r} (rule: {rule}): {hint}")


class InvalidValue(GraphKvcacheError, ValueError):
    """A value that cannot be stored: too large, or not decodable as given."""


class ConfigError(GraphKvcacheError, ValueError):
    """A setting (environment variable or flag) that cannot be used as given."""


class ProcessError(GraphKvcacheError):
    """A managed process could not be started, found, or stopped."""


class EngineProcessError(ProcessError):
    """The managed epistemic-graph engine could not be started, found, or stopped."""


class VllmProcessError(ProcessError):
    """The managed vLLM server could not be started, found, or stopped."""


class LmcacheProcessError(ProcessError):
    """The managed `lmcache server` could not be started, found, or stopped."""


def describe_validation(exc: ValidationError, *, whole: str) -> str:
    """`field.path: message; ...` for every problem pydantic found.

    `whole` names a problem with the model as a whole (no field path). Used wherever loose
    input (settings, flags, tool or JSONL payloads) becomes a typed error.
    """
    return "; ".join(
        f"{'.'.join(str(part) for part in error['loc']) or whole}: "
        f"{error['msg'].removeprefix('Value error, ')}"
        for error in exc.errors(include_url=False, include_input=False)
    )
