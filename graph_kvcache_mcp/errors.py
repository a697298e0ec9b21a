"""The library's exceptions: a caller's mistake is an exception, the state of the world is a value.

    GraphKvcacheError
     ├── InvalidKey        (also ValueError)  a key the engine would refuse or misread
     ├── InvalidValue      (also ValueError)  a value too large, or bytes that do not decode
     │    └── FileRefused                      a path a tool may not use, or a file it won't read
     ├── ConfigError       (also ValueError)  a setting that cannot be used as given
     ├── VllmRequestError  (also ValueError)  a request vLLM refused (unknown model, too long)
     └── ProcessError                         a managed process could not be started or stopped
          ├── EngineProcessError
          ├── VllmProcessError
          └── LmcacheProcessError

Messages name what is wrong and how to fix it, and never contain a secret.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import ValidationError
from pydantic_core import ErrorDetails


class GraphKvcacheError(Exception):
    """Base class for every error this package raises on purpose."""


class InvalidKey(GraphKvcacheError, ValueError):
    """A key that breaks one of the engine's key rules (see `domain.engine.keys`)."""

    def __init__(self, key: str, *, rule: str, hint: str) -> None:
        self.key = key
        self.rule = rule
        self.hint = hint
        super().__init__(f"invalid key {quoted(key, limit=80)} (rule: {rule}): {hint}")


class InvalidValue(GraphKvcacheError, ValueError):
    """A value that cannot be stored: too large, or not decodable as given."""


class FileRefused(InvalidValue):
    """A path outside the allowed roots, or a file that is not a readable regular file within the
    size limit (a device, FIFO, socket, directory, symlink where none may be, or too large)."""


class ConfigError(GraphKvcacheError, ValueError):
    """A setting (environment variable or flag) that cannot be used as given."""


class VllmRequestError(GraphKvcacheError, ValueError):
    """vLLM refused the request itself (4xx): unknown model, prompt too long, bad parameter."""

    def __init__(self, message: str, *, status: int) -> None:
        self.status = status
        super().__init__(message)


class ProcessError(GraphKvcacheError):
    """A managed process could not be started, found, or stopped."""


class EngineProcessError(ProcessError):
    """The managed epistemic-graph engine could not be started, found, or stopped."""


class VllmProcessError(ProcessError):
    """The managed vLLM server could not be started, found, or stopped."""


class LmcacheProcessError(ProcessError):
    """The managed `lmcache server` could not be started, found, or stopped."""


class EdgeProcessError(ProcessError):
    """The host's managed TLS edge (haproxy) could not be started, found, rotated or stopped."""


QUOTE_LIMIT = 200
"""How many characters of an argument an error message quotes."""


def quoted(value: object, *, limit: int = QUOTE_LIMIT) -> str:
    """`value` as an error message quotes it: its repr, cut to `limit` characters with its length
    named when longer (an error never echoes a 10 MB argument back)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = len(value) if isinstance(value, str) else len(text)
    return f"{text[: limit - 3]}... ({size} characters)"


def shortened(text: str, *, limit: int = QUOTE_LIMIT) -> str:
    """`text` as is when short, else its first `limit` characters and its length (no quotes)."""
    if len(text) <= limit:
        return text
    return f"{text[: limit - 3]}... ({len(text)} characters)"


def describe_validation(
    exc: ValidationError,
    *,
    whole: str,
    accepted: Sequence[str] = (),
    noun: str = "field",
) -> str:
    """`name: what is wrong; ...` for every problem pydantic found, without its boilerplate.

    `whole` names a problem with the model as a whole (no field path). `accepted` lists the
    valid names, quoted when a name is unknown; `noun` is what a name is called ("argument").
    Used wherever loose input (settings, flags, tool arguments or JSONL payloads) becomes a typed
    error or a tool error; input values are never quoted (they may be secrets or huge).
    """
    problems: list[str] = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(part) for part in error["loc"]) or whole
        problem = f"{where}: {_what_is_wrong(error, accepted, noun)}"
        if error["type"].endswith("_type") and error["type"] != "model_type":
            problem += f" (got {json_kind(error['input'])})"  # the kind only: values may be secret
        if problem not in problems:
            problems.append(problem)
    return "; ".join(problems)


def json_kind(value: object) -> str:
    """What kind of JSON value `value` is, as a message names it ("a string", "null")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    return "an object"


def _what_is_wrong(error: ErrorDetails, accepted: Sequence[str], noun: str) -> str:
    if error["type"] == "missing":
        return f"required {noun} missing"
    if error["type"] == "extra_forbidden":
        valid = f" (valid: {', '.join(accepted)})" if accepted else ""
        return f"unknown {noun}{valid}"
    message = error["msg"].removeprefix("Value error, ")
    return message.replace("Input should be", "should be", 1)
