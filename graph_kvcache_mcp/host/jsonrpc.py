"""What to answer a message the transport could not read as one JSON-RPC 2.0 message.

JSON-RPC 2.0 names two answers: `-32700` (parse error) for text that is not JSON, `-32600`
(invalid request) for JSON that is not a request, notification or response. Either answer
carries the message's id when one can be read, so the client's waiting call fails at once
instead of at its timeout; `null` otherwise. A batch (a JSON array) is refused element by
element: MCP removed JSON-RPC batching in its 2025-06-18 revision.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from graph_kvcache_mcp.errors import json_kind

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
INVALID_PARAMS = -32602

RequestId = str | int

_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")
_ONE_PER_LINE = "send one JSON-RPC 2.0 object per line"


@dataclass(frozen=True)
class Refusal:
    """One JSON-RPC error to send back: to `id` (None: `"id": null`), with `code` and `message`."""

    id: RequestId | None
    code: int
    message: str


def refuse_text(text: str) -> list[Refusal]:
    """The answers to a line that a strict JSON parser refused (the SDK's parser is strict).

    Python's own parser is looser: it reads lone surrogate escapes (`"\\ud83d"`, a JavaScript
    string cut inside an emoji) and `NaN`; such a line is still refused, but with its id.
    """
    try:
        value = json.loads(text)
    except ValueError as exc:
        return [Refusal(None, PARSE_ERROR, f"Parse error: not JSON ({exc}); {_ONE_PER_LINE}")]
    if _has_lone_surrogate(value):
        why = (
            "a string holds an unpaired UTF-16 surrogate escape such as \\ud83d (text cut "
            "inside a character); send whole characters"
        )
    else:
        why = "not strict JSON (NaN, Infinity or a similar extension)"
    return [Refusal(readable_id(value), PARSE_ERROR, f"Parse error: {why}")]


def refuse_value(value: object) -> list[Refusal]:
    """The answers to JSON that is not one valid JSON-RPC 2.0 message."""
    if isinstance(value, list):
        return _refuse_batch(value)
    if not isinstance(value, dict):
        kind = json_kind(value)
        return [_invalid(None, f"a JSON-RPC message is an object, got {kind}; {_ONE_PER_LINE}")]
    return [_invalid(readable_id(value), _what_is_wrong(value))]


def readable_id(value: object) -> RequestId | None:
    """The message's id when it is one JSON-RPC allows (a string or an integer), else None."""
    if not isinstance(value, dict):
        return None
    found = value.get("id")
    if isinstance(found, str) or (isinstance(found, int) and not isinstance(found, bool)):
        return found
    return None


def _refuse_batch(items: list[object]) -> list[Refusal]:
    why = "JSON-RPC batches are not part of MCP (removed in 2025-06-18); " + _ONE_PER_LINE
    if not items:
        return [_invalid(None, f"an empty batch; {_ONE_PER_LINE}")]
    ids = [found for item in items if (found := readable_id(item)) is not None]
    return [_invalid(found, why) for found in ids] or [_invalid(None, why)]


def _what_is_wrong(message: dict[object, object]) -> str:
    if message.get("jsonrpc") != "2.0":
        return 'field jsonrpc must be "2.0"'
    if "id" in message and readable_id(message) is None and "method" in message:
        return f"field id must be a string or an integer, got {json_kind(message['id'])}"
    if "method" not in message:
        if "result" in message or "error" in message:
            return "a response must carry either result or error and the id of a request"
        return "a message with an id needs a method (a request) or result/error (a response)"
    if not isinstance(message["method"], str):
        return f"field method must be a string, got {json_kind(message['method'])}"
    if "params" in message and not isinstance(message["params"], dict):
        return f"field params must be an object, got {json_kind(message['params'])}"
    return "not a valid JSON-RPC 2.0 request, notification or response"


def _invalid(found: RequestId | None, why: str) -> Refusal:
    return Refusal(found, INVALID_REQUEST, f"Invalid request: {why}")


def _has_lone_surrogate(value: object) -> bool:
    if isinstance(value, str):
        return _LONE_SURROGATE.search(value) is not None
    if isinstance(value, list):
        return any(_has_lone_surrogate(item) for item in value)
    if isinstance(value, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in value.items())
    return False
