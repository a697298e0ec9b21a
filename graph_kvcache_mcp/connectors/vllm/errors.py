"""Why a call to vLLM failed, in words a caller can act on.

Three ways vLLM can fail to answer, each an `Unavailable` with its own reason:
- unreachable: nothing accepted the connection (refused, DNS, no route);
- timed out: it accepted but sent nothing within the deadline of that kind of call, named in the
  reason (`GRAPH_KVCACHE_VLLM_TIMEOUT_S` for a chat: its whole answer, or the gap between two
  chunks of a streamed one; `GRAPH_KVCACHE_VLLM_PROBE_TIMEOUT_S` for /health, /metrics, models);
- bad answer: it answered, but not as vLLM does (not HTTP, not JSON, an unexpected shape, an HTML
  page from a proxy, a 5xx with vLLM's own message).
A request vLLM refuses (4xx other than auth) is the caller's mistake: `VllmRequestError`.
This module does not import openai (the /metrics reader uses it too); the openai SDK's own
failures are mapped onto these reasons in `connectors.vllm.chat_requests`.
"""

from __future__ import annotations

import httpx2

from graph_kvcache_mcp.connectors.net.tls_trust import certificate_reason
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.domain.vllm.deadlines import CALL_TIMEOUT_ENV
from graph_kvcache_mcp.errors import VllmRequestError

MAX_MESSAGE_CHARS = 300


def unreachable(root_url: str, exc: BaseException, *, trusted: str | None = None) -> Unavailable:
    """Nothing answered, or (named as such) the answer's certificate was not trusted;
    `trusted`: the CAs the client was given (a fleet's), when not the environment's."""
    if (untrusted := certificate_reason(exc, trusted=trusted)) is not None:
        return Unavailable(f"vLLM at {root_url} was not trusted: {untrusted}")
    return Unavailable(
        f"vLLM not reachable at {root_url} ({type(exc).__name__}); start it with vllm_start or "
        "check VLLM_BASE_URL"
    )


def timed_out(
    root_url: str, timeout_s: float, *, streamed: bool = False, knob: str = CALL_TIMEOUT_ENV
) -> Unavailable:
    """`knob`: the variable that sets this very deadline (so raising it is the right advice)."""
    what = "sent no chunk of its streamed answer for" if streamed else "did not answer within"
    return Unavailable(
        f"vLLM at {root_url} {what} {timeout_s:g} s ({knob}); it may be "
        "overloaded or stuck: see vllm_status and vllm_logs"
    )


def bad_answer(root_url: str, detail: str, *, status: int | None = None) -> Unavailable:
    return Unavailable(
        f"vLLM at {root_url} sent a bad answer ({detail}); check that VLLM_BASE_URL points at "
        "vLLM itself and not at a proxy or another service",
        status=status,
    )


def from_transport(
    exc: httpx2.HTTPError,
    root_url: str,
    timeout_s: float,
    *,
    streamed: bool = False,
    knob: str = CALL_TIMEOUT_ENV,
    trusted: str | None = None,
) -> Unavailable:
    """An httpx failure, on a call or on one of vLLM's own routes (/tokenize, /metrics, ...)."""
    if isinstance(exc, httpx2.TimeoutException) and not isinstance(exc, httpx2.ConnectTimeout):
        return timed_out(root_url, timeout_s, streamed=streamed, knob=knob)
    if isinstance(exc, httpx2.ProtocolError | httpx2.DecodingError):
        return bad_answer(root_url, f"not valid HTTP: {type(exc).__name__}")
    return unreachable(root_url, exc, trusted=trusted)


def from_status(status: int, message: str, root_url: str) -> Unavailable:
    """A non-2xx answer with vLLM's message.

    Raises:
        VllmRequestError: 4xx other than 401/403 (the request was wrong, not the server).
    """
    if status in (401, 403):
        return Unavailable(
            f"vLLM at {root_url} refused the API key (HTTP {status}); set VLLM_API_KEY to the key "
            "the server was started with",
            status=status,
        )
    if 400 <= status < 500:
        raise VllmRequestError(
            f"vLLM refused the request (HTTP {status}): {message}", status=status
        )
    return bad_answer(root_url, f"HTTP {status}: {message}", status=status)


def response_message(reply: httpx2.Response) -> str:
    """vLLM's own error message from a raw answer, else the start of its body."""
    try:
        payload: object = reply.json()
    except ValueError:
        return reply.text[:MAX_MESSAGE_CHARS] or "(empty body)"
    return message_of(payload) or reply.text[:MAX_MESSAGE_CHARS]


def message_of(body: object) -> str | None:
    """`message` of `{"error": {"message": ...}}` (newer vLLM) or `{"message": ...}` (older)."""
    if not isinstance(body, dict):
        return None
    error = body.get("error")
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])[:MAX_MESSAGE_CHARS]
    if isinstance(error, str) and error:
        return error[:MAX_MESSAGE_CHARS]
    if body.get("message"):
        return str(body["message"])[:MAX_MESSAGE_CHARS]
    return None


def json_object(
    reply: httpx2.Response, root_url: str, path: str
) -> dict[str, object] | Unavailable:
    """The JSON object of a 200 answer on `path`, or why it is not one.

    Raises:
        VllmRequestError: vLLM refused the request (4xx other than 401/403).
    """
    if reply.status_code != 200:
        return from_status(reply.status_code, response_message(reply), root_url)
    try:
        payload: object = reply.json()
    except ValueError:
        return bad_answer(root_url, f"{path} answered with no JSON: {_start_of(reply)}")
    if not isinstance(payload, dict):
        return bad_answer(root_url, f"{path} answered {type(payload).__name__}, not an object")
    return payload


def _start_of(reply: httpx2.Response) -> str:
    kind = reply.headers.get("content-type", "no content-type")
    text = " ".join(reply.text[:80].split())
    return f"{kind}, {text!r}"
