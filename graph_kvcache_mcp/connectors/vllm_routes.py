"""vLLM's own routes the diagnoses use: the token ids of a chat request (`POST /tokenize` with
`messages`), the text of token ids (`POST /detokenize`), and `GET /version`.

The request goes through the served model's chat template with the generation prompt added, as a
chat completion does, so the ids are the ones the prefix cache hashes. Its own small HTTP client:
a diagnosis makes a handful of calls, and the chat client's transport is not shared out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Self

import httpx2
from pydantic import BaseModel, ConfigDict, SecretStr

from graph_kvcache_mcp.connectors.vllm_metrics import server_root
from graph_kvcache_mcp.connectors.vllm_openai import VllmRequestError
from graph_kvcache_mcp.domain.outcomes import Unavailable

TEMPLATE_FIELDS = (
    "tools",
    "chat_template",
    "chat_template_kwargs",
    "add_generation_prompt",
    "continue_final_message",
)
"""Fields of a chat-completions body that reach the chat template, forwarded to /tokenize."""


class ChatTokens(BaseModel):
    """The prompt token ids of one chat request."""

    model_config = ConfigDict(frozen=True)

    tokens: list[int]
    max_model_len: int | None = None


class VllmRoutes:
    """One vLLM server's /tokenize, /detokenize and /version. Use as `async with`."""

    def __init__(
        self, base_url: str, *, api_key: SecretStr | None = None, timeout_s: float = 30.0
    ) -> None:
        self.root_url = server_root(base_url)  # validates: loopback http or https
        headers = {"Authorization": f"Bearer {api_key.get_secret_value()}"} if api_key else {}
        self._http = httpx2.AsyncClient(
            timeout=httpx2.Timeout(timeout_s, connect=min(timeout_s, 5.0)), headers=headers
        )

    def __repr__(self) -> str:
        return f"VllmRoutes({self.root_url!r})"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self._http.aclose()

    async def tokenize_chat(
        self, request: Mapping[str, Any], *, model: str
    ) -> ChatTokens | Unavailable:
        """The prompt ids of a chat-completions body (its messages and template fields).

        Raises:
            VllmRequestError: vLLM refused the request (a malformed message, an unknown model).
        """
        body: dict[str, Any] = {"model": model, "messages": list(request["messages"])}
        body.update({k: request[k] for k in TEMPLATE_FIELDS if k in request})
        body.setdefault("add_generation_prompt", not body.get("continue_final_message", False))
        reply = await self._post("/tokenize", body)
        if isinstance(reply, Unavailable):
            return reply
        tokens = reply.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            return Unavailable(f"vLLM at {self.root_url} sent /tokenize without token ids")
        limit = reply.get("max_model_len")
        return ChatTokens(tokens=tokens, max_model_len=limit if isinstance(limit, int) else None)

    async def detokenize(self, tokens: Sequence[int], *, model: str) -> str | Unavailable:
        """The text of `tokens`.

        Raises:
            VllmRequestError: vLLM refused the ids.
        """
        reply = await self._post("/detokenize", {"model": model, "tokens": list(tokens)})
        if isinstance(reply, Unavailable):
            return reply
        return str(reply.get("prompt", ""))

    async def version(self) -> str | Unavailable:
        """The server's version string (`GET /version`)."""
        try:
            reply = await self._http.get(self.root_url + "/version")
        except httpx2.HTTPError as exc:
            return self._down(exc)
        if reply.status_code != 200:
            return Unavailable(
                f"vLLM at {self.root_url} answered HTTP {reply.status_code} on /version",
                status=reply.status_code,
            )
        try:
            payload = reply.json()
        except ValueError:
            return Unavailable(f"vLLM at {self.root_url} sent an unexpected /version answer")
        return str(payload.get("version") if isinstance(payload, dict) else payload)

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any] | Unavailable:
        try:
            reply = await self._http.post(self.root_url + path, json=body)
        except httpx2.HTTPError as exc:
            return self._down(exc)
        if reply.status_code in (401, 403):
            return Unavailable(
                f"vLLM at {self.root_url} refused the API key (HTTP {reply.status_code}); set "
                "VLLM_API_KEY to the key the server was started with",
                status=reply.status_code,
            )
        if 400 <= reply.status_code < 500:
            raise VllmRequestError(
                f"vLLM refused {path} (HTTP {reply.status_code}): {_message(reply)}",
                status=reply.status_code,
            )
        if reply.status_code != 200:
            return Unavailable(
                f"vLLM at {self.root_url} answered HTTP {reply.status_code} on {path}",
                status=reply.status_code,
            )
        try:
            payload = reply.json()
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            return Unavailable(f"vLLM at {self.root_url} sent an unexpected {path} answer")
        return payload

    def _down(self, exc: Exception) -> Unavailable:
        return Unavailable(
            f"vLLM not reachable at {self.root_url} ({type(exc).__name__}); start it with "
            "vllm_start or check VLLM_BASE_URL"
        )


def _message(reply: httpx2.Response) -> str:
    try:
        payload = reply.json()
    except ValueError:
        return reply.text[:300]
    error = payload.get("error", payload) if isinstance(payload, dict) else payload
    message = error.get("message") if isinstance(error, dict) else error
    return str(message)[:300]
