"""vLLM's own routes beside the OpenAI API: `/health`, `/tokenize` (a prompt's count, or a chat
request's token ids), `/detokenize`, `/version`, `/reset_prefix_cache`.

A chat request is tokenized through the served model's chat template with the generation prompt
added, as a chat completion does, so the ids are the ones the prefix cache hashes.

Plain httpx calls on the client's shared `httpx2.AsyncClient`; every answer is checked before it
is read (`connectors.vllm.errors`), so a proxy's page or a foreign shape is a bad answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import httpx2
from pydantic import BaseModel, ConfigDict

from graph_kvcache_mcp.connectors.vllm import errors as vllm_errors
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.domain.vllm.chat import PrefixCacheReset
from graph_kvcache_mcp.domain.vllm.deadlines import DEFAULT_PROBE_TIMEOUT_S, PROBE_TIMEOUT_ENV

NO_DEV_MODE = (
    "the server has no /reset_prefix_cache route: vLLM only offers it with VLLM_SERVER_DEV_MODE=1 "
    "in its environment; restart it that way (vllm_start with dev_mode=true) to reset the prefix "
    "cache"
)

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
    """One server's own routes, through a shared `httpx2.AsyncClient` (not owned here)."""

    def __init__(
        self,
        http: httpx2.AsyncClient,
        root_url: str,
        *,
        timeout_s: float,
        probe_timeout_s: float = DEFAULT_PROBE_TIMEOUT_S,
        trusted: str | None = None,
    ) -> None:
        """`trusted`: the CAs `http` was given (a fleet's), named in a certificate failure."""
        self.root_url = root_url
        self._trusted = trusted
        self.timeout_s = timeout_s
        self.probe_timeout_s = probe_timeout_s
        self._http = http

    def __repr__(self) -> str:
        return f"VllmRoutes({self.root_url!r})"

    async def health(self) -> bool | Unavailable:
        """True when `GET /health` answers 200."""
        try:
            reply = await self._http.get(self.root_url + "/health", timeout=self.probe_timeout_s)
        except httpx2.HTTPError as exc:
            return vllm_errors.from_transport(
                exc,
                self.root_url,
                self.probe_timeout_s,
                knob=PROBE_TIMEOUT_ENV,
                trusted=self._trusted,
            )
        if reply.status_code != 200:
            return Unavailable(
                f"vLLM at {self.root_url} is not healthy (HTTP {reply.status_code})",
                status=reply.status_code,
            )
        return True

    async def token_count(self, body: dict[str, object]) -> int | Unavailable:
        """`count` of `POST /tokenize` with `body`.

        Raises:
            VllmRequestError: vLLM refused the request.
        """
        payload = await self._post_json("/tokenize", body)
        if isinstance(payload, Unavailable):
            return payload
        count = payload.get("count")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            return vllm_errors.bad_answer(self.root_url, "/tokenize answered without a count")
        return count

    async def tokenize_chat(
        self, request: Mapping[str, Any], *, model: str
    ) -> ChatTokens | Unavailable:
        """The prompt ids of a chat-completions body (its messages and template fields).

        Raises:
            VllmRequestError: vLLM refused the request (a malformed message, an unknown model).
        """
        body: dict[str, object] = {"model": model, "messages": list(request["messages"])}
        body.update({k: request[k] for k in TEMPLATE_FIELDS if k in request})
        body.setdefault("add_generation_prompt", not body.get("continue_final_message", False))
        payload = await self._post_json("/tokenize", body)
        return self._token_ids(payload)

    def _token_ids(self, payload: dict[str, object] | Unavailable) -> ChatTokens | Unavailable:
        if isinstance(payload, Unavailable):
            return payload
        tokens = payload.get("tokens")
        if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in tokens
        ):
            return vllm_errors.bad_answer(self.root_url, "/tokenize answered without token ids")
        limit = payload.get("max_model_len")
        return ChatTokens(tokens=tokens, max_model_len=limit if isinstance(limit, int) else None)

    async def tokenize_prompt(self, prompt: str, *, model: str) -> ChatTokens | Unavailable:
        """The token ids of a completions prompt (special tokens added, as a completion does).

        Raises:
            VllmRequestError: vLLM refused the request.
        """
        payload = await self._post_json("/tokenize", {"model": model, "prompt": prompt})
        return self._token_ids(payload)

    async def detokenize(self, tokens: Sequence[int], *, model: str) -> str | Unavailable:
        """The text of `tokens`.

        Raises:
            VllmRequestError: vLLM refused the ids.
        """
        payload = await self._post_json("/detokenize", {"model": model, "tokens": list(tokens)})
        if isinstance(payload, Unavailable):
            return payload
        return str(payload.get("prompt", ""))

    async def version(self) -> str | Unavailable:
        """The server's version string (`GET /version`)."""
        try:
            with anyio.fail_after(self.timeout_s):
                reply = await self._http.get(self.root_url + "/version")
        except TimeoutError:
            return vllm_errors.timed_out(self.root_url, self.timeout_s)
        except httpx2.HTTPError as exc:
            return vllm_errors.from_transport(
                exc, self.root_url, self.timeout_s, trusted=self._trusted
            )
        payload = vllm_errors.json_object(reply, self.root_url, "/version")
        if isinstance(payload, Unavailable):
            return payload
        return str(payload.get("version"))

    async def reset_prefix_cache(self) -> PrefixCacheReset | Unavailable:
        """Drop every cached prefix block (`POST /reset_prefix_cache`, a dev-mode route)."""
        reply = await self._post("/reset_prefix_cache", None)
        if isinstance(reply, Unavailable):
            return reply
        if reply.status_code == 404:
            return PrefixCacheReset(reset=False, dev_mode=False, reason=NO_DEV_MODE)
        if reply.status_code != 200:
            message = vllm_errors.response_message(reply)
            return vllm_errors.bad_answer(
                self.root_url,
                f"HTTP {reply.status_code} to reset_prefix_cache: {message}",
                status=reply.status_code,
            )
        success = True
        if reply.content:  # older vLLM answers 200 with no body
            payload = vllm_errors.json_object(reply, self.root_url, "/reset_prefix_cache")
            if isinstance(payload, Unavailable):
                return payload
            success = payload.get("success") is not False
        return PrefixCacheReset(
            reset=success,
            dev_mode=True,
            reason=None if success else "vLLM refused to reset (requests were still running?)",
        )

    async def _post(
        self, path: str, body: dict[str, object] | None
    ) -> httpx2.Response | Unavailable:
        try:
            with anyio.fail_after(self.timeout_s):
                return await self._http.post(self.root_url + path, json=body)
        except TimeoutError:
            return vllm_errors.timed_out(self.root_url, self.timeout_s)
        except httpx2.HTTPError as exc:
            return vllm_errors.from_transport(
                exc, self.root_url, self.timeout_s, trusted=self._trusted
            )

    async def _post_json(
        self, path: str, body: dict[str, object]
    ) -> dict[str, object] | Unavailable:
        reply = await self._post(path, body)
        if isinstance(reply, Unavailable):
            return reply
        return vllm_errors.json_object(reply, self.root_url, path)
