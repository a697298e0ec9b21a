"""A vLLM client with per-call cache accounting: every chat/completion call returns a `Trace`.

Built on the official `openai` async client (bounded timeout and retries, api key optional) with
one shared `httpx2.AsyncClient`, which also serves vLLM's own routes (`/tokenize`, `/metrics`,
`/reset_prefix_cache`, `/health`).

Where the cached-token count comes from, in order:
1. `usage.prompt_tokens_details.cached_tokens` (`source="usage"`), which vLLM fills only when it
   runs with `--enable-prompt-tokens-details`;
2. otherwise the move of `vllm:prefix_cache_hits_total` for the model across the call
   (`source="metrics_delta"`), trusted only when `vllm:prompt_tokens_total` moved by exactly this
   call's prompt tokens, i.e. no other request ran in between;
3. otherwise `source="unavailable"` with a note. Never 0 for "unknown".
The client learns whether the server fills the usage field, and scrapes `/metrics` around a call
only while it does not.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self, cast

import anyio
import httpx2
import openai
from openai.types.chat import ChatCompletionStreamOptionsParam
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.vllm_metrics import VllmMetricsClient, server_root
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.domain.traces import Trace, cache_split
from graph_kvcache_mcp.domain.vllm_metrics import MetricsSnapshot, UnknownModel
from graph_kvcache_mcp.errors import GraphKvcacheError

DEFAULT_MAX_TOKENS = 64
DEFAULT_MAX_RETRIES = 2
METRICS_SETTLE_S = 2.0  # how long to wait for /metrics to show a call that already returned
_NO_KEY = "EMPTY"  # vLLM without --api-key accepts any bearer; openai insists on one


class VllmRequestError(GraphKvcacheError, ValueError):
    """vLLM refused the request itself (4xx): unknown model, prompt too long, bad parameter."""

    def __init__(self, message: str, *, status: int) -> None:
        self.status = status
        super().__init__(message)


class ChatResult(BaseModel):
    """The model's answer and the call's cache accounting."""

    model_config = ConfigDict(frozen=True)

    answer: str
    trace: Trace


class PrefixCacheReset(BaseModel):
    """What `POST /reset_prefix_cache` did."""

    model_config = ConfigDict(frozen=True)

    reset: bool
    dev_mode: bool = Field(description="False when the route is absent (VLLM_SERVER_DEV_MODE off).")
    reason: str | None = None


class VllmClient:
    """One vLLM server. Use as `async with VllmClient(url) as client:` or call `aclose()`."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: SecretStr | None = None,
        timeout_s: float = 120.0,
        max_retries: int = DEFAULT_MAX_RETRIES,
        metrics_fallback: bool = True,
    ) -> None:
        self.root_url = server_root(base_url)  # validates: loopback http or https
        self.base_url = self.root_url + "/v1"
        self.metrics_fallback = metrics_fallback
        headers = {"Authorization": f"Bearer {api_key.get_secret_value()}"} if api_key else {}
        self._http = httpx2.AsyncClient(
            timeout=httpx2.Timeout(timeout_s, connect=min(timeout_s, 5.0)), headers=headers
        )
        self._openai = openai.AsyncOpenAI(
            api_key=api_key.get_secret_value() if api_key else _NO_KEY,
            base_url=self.base_url,
            timeout=timeout_s,
            max_retries=max_retries,
            http_client=self._http,
        )
        self.metrics = VllmMetricsClient(self._http, self.root_url + "/metrics")
        self._details_filled: bool | None = None  # learned from the first answers
        self._models: list[str] | None = None

    @classmethod
    def from_settings(cls, settings: Settings, *, base_url: str | None = None) -> Self:
        return cls(
            base_url or settings.vllm_base_url,
            api_key=settings.vllm_api_key,
            timeout_s=settings.vllm_timeout_s,
        )

    def __repr__(self) -> str:
        return f"VllmClient({self.base_url!r})"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._openai.close()
        await self._http.aclose()

    # --- server facts ------------------------------------------------------------------------

    async def health(self) -> bool | Unavailable:
        """True when `GET /health` answers 200."""
        try:
            reply = await self._http.get(self.root_url + "/health", timeout=5.0)
        except httpx2.HTTPError as exc:
            return self._down(exc)
        if reply.status_code != 200:
            return Unavailable(
                f"vLLM at {self.root_url} is not healthy (HTTP {reply.status_code})",
                status=reply.status_code,
            )
        return True

    async def models(self) -> list[str] | Unavailable:
        """The served model names (`GET /v1/models`)."""
        try:
            page = await self._openai.models.list()
        except openai.APIError as exc:
            return self._failed(exc)
        self._models = [model.id for model in page.data]
        return list(self._models)

    async def resolve_model(self, model: str | None) -> str | Unavailable:
        """`model` itself, or the server's only model when None.

        Raises:
            VllmRequestError: no model given and the server serves several.
        """
        if model:
            return model
        served = self._models if self._models is not None else await self.models()
        if isinstance(served, Unavailable):
            return served
        if len(served) != 1:
            raise VllmRequestError(
                f"vLLM at {self.root_url} serves {len(served)} models ({', '.join(served)}): "
                "name one with model=",
                status=400,
            )
        return served[0]

    # --- calls -------------------------------------------------------------------------------

    async def chat(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        model: str | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        temperature: float = 0.0,
        stream: bool = False,
    ) -> ChatResult | Unavailable:
        """One chat completion and its `Trace`.

        Raises:
            VllmRequestError: vLLM refused the request (its message says why).
        """
        request: dict[str, Any] = {
            "messages": [dict(message) for message in messages],
            "max_tokens": max_tokens,
            "temperature": temperature,
        }
        return await self._call("chat", request, model=model, stream=stream)

    async def complete(
        self,
        prompt: str,
        *,
        model: str | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        temperature: float = 0.0,
        stream: bool = False,
    ) -> ChatResult | Unavailable:
        """One plain completion (no chat template) and its `Trace`.

        Raises:
            VllmRequestError: vLLM refused the request (its message says why).
        """
        request: dict[str, Any] = {
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": temperature,
        }
        return await self._call("completion", request, model=model, stream=stream)

    async def tokenize(
        self,
        text: str | None = None,
        *,
        messages: Sequence[Mapping[str, str]] | None = None,
        model: str | None = None,
    ) -> int | Unavailable:
        """How many tokens vLLM makes of `text`, or of `messages` through the chat template
        (with the generation prompt, as a chat call would send them).

        Raises:
            VllmRequestError: vLLM refused the request.
            ValueError: neither or both of `text` and `messages` given.
        """
        if (text is None) == (messages is None):
            raise ValueError("tokenize takes exactly one of text= or messages=")
        chosen = await self.resolve_model(model)
        if isinstance(chosen, Unavailable):
            return chosen
        body: dict[str, Any] = {"model": chosen}
        if text is not None:
            body["prompt"] = text
        else:
            body["messages"] = [dict(m) for m in messages or ()]
            body["add_generation_prompt"] = True
        reply = await self._post_json("/tokenize", body)
        if isinstance(reply, Unavailable):
            return reply
        return int(reply["count"])

    async def reset_prefix_cache(self) -> PrefixCacheReset | Unavailable:
        """Drop every cached prefix block (`POST /reset_prefix_cache`, a dev-mode route)."""
        try:
            reply = await self._http.post(self.root_url + "/reset_prefix_cache")
        except httpx2.HTTPError as exc:
            return self._down(exc)
        if reply.status_code == 404:
            return PrefixCacheReset(
                reset=False,
                dev_mode=False,
                reason="the server has no /reset_prefix_cache route: vLLM only offers it with "
                "VLLM_SERVER_DEV_MODE=1 in its environment; restart it that way (vllm_start "
                "with dev_mode=true) to reset the prefix cache",
            )
        if reply.status_code != 200:
            return Unavailable(
                f"vLLM at {self.root_url} answered HTTP {reply.status_code} to reset_prefix_cache",
                status=reply.status_code,
            )
        success = True
        if reply.content:
            payload = reply.json()
            if isinstance(payload, dict) and payload.get("success") is False:
                success = False
        return PrefixCacheReset(
            reset=success,
            dev_mode=True,
            reason=None if success else "vLLM refused to reset (requests were still running?)",
        )

    # --- internals ---------------------------------------------------------------------------

    async def _call(
        self, kind: str, request: dict[str, Any], *, model: str | None, stream: bool
    ) -> ChatResult | Unavailable:
        chosen = await self.resolve_model(model)
        if isinstance(chosen, Unavailable):
            return chosen
        before = await self._snapshot_if_needed(chosen)
        started_at = time.time()
        start = time.perf_counter()
        try:
            if stream:
                answer, usage, finish, ttft = await self._streamed(kind, chosen, request, start)
            else:
                answer, usage, finish = await self._whole(kind, chosen, request)
                ttft = None
        except openai.APIError as exc:
            return self._failed(exc)
        latency = time.perf_counter() - start
        prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
        hit, source, note = await self._cached_tokens(usage, chosen, prompt_tokens, before)
        external = None
        if isinstance(hit, _TieredHit):
            external = hit.external
            hit = hit.total
        hit_tokens, miss_tokens = cache_split(prompt_tokens, hit)
        trace = Trace(
            model=chosen,
            prompt_tokens=prompt_tokens,
            completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
            prefix_cache_hit_tokens=hit_tokens,
            prefix_cache_miss_tokens=miss_tokens,
            external_cache_hit_tokens=external,
            cached_tokens_source=source,
            latency_s=latency,
            ttft_s=ttft,
            stream=stream,
            finish_reason=finish,
            started_at=started_at,
            note=note,
        )
        return ChatResult(answer=answer, trace=trace)

    async def _whole(
        self, kind: str, model: str, request: dict[str, Any]
    ) -> tuple[str, Any, str | None]:
        if kind == "chat":
            reply = await self._openai.chat.completions.create(
                model=model, **cast(Any, request), stream=False
            )
            choice = reply.choices[0] if reply.choices else None
            text = (choice.message.content or "") if choice else ""
            return text, reply.usage, choice.finish_reason if choice else None
        completion = await self._openai.completions.create(
            model=model, **cast(Any, request), stream=False
        )
        first = completion.choices[0] if completion.choices else None
        return (
            (first.text if first else ""),
            completion.usage,
            first.finish_reason if first else None,
        )

    async def _streamed(
        self, kind: str, model: str, request: dict[str, Any], start: float
    ) -> tuple[str, Any, str | None, float | None]:
        parts: list[str] = []
        usage: Any = None
        finish: str | None = None
        ttft: float | None = None
        options: ChatCompletionStreamOptionsParam = {"include_usage": True}
        chunks: AsyncIterator[Any]
        if kind == "chat":
            chunks = await self._openai.chat.completions.create(
                model=model, **cast(Any, request), stream=True, stream_options=options
            )
        else:
            chunks = await self._openai.completions.create(
                model=model, **cast(Any, request), stream=True, stream_options=options
            )
        async for chunk in chunks:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                # vLLM's first chunk comes with the first generated token (after prefill).
                if ttft is None:
                    ttft = time.perf_counter() - start
                text = choice.delta.content if kind == "chat" else choice.text
                if text:
                    parts.append(text)
                if choice.finish_reason:
                    finish = choice.finish_reason
        return "".join(parts), usage, finish, ttft

    async def _snapshot_if_needed(self, model: str) -> MetricsSnapshot | None:
        if not self.metrics_fallback or self._details_filled:
            return None
        return await self._quiet_snapshot(model)

    async def _quiet_snapshot(self, model: str) -> MetricsSnapshot | None:
        try:
            snapshot = await self.metrics.snapshot(model)
        except UnknownModel:
            return None
        return None if isinstance(snapshot, Unavailable) else snapshot

    async def _cached_tokens(
        self, usage: Any, model: str, prompt_tokens: int, before: MetricsSnapshot | None
    ) -> tuple[int | _TieredHit | None, Any, str | None]:
        details = getattr(usage, "prompt_tokens_details", None)
        cached = getattr(details, "cached_tokens", None) if details is not None else None
        if cached is not None:
            self._details_filled = True
            return int(cached), "usage", None
        self._details_filled = False
        if usage is None:
            return None, "unavailable", "the response carried no usage block"
        if before is None:
            why = "disabled" if not self.metrics_fallback else "not readable before the call"
            return (
                None,
                "unavailable",
                (
                    "vLLM left usage.prompt_tokens_details empty (start it with "
                    f"--enable-prompt-tokens-details) and /metrics was {why}"
                ),
            )
        return await self._from_metrics(model, prompt_tokens, before)

    async def _from_metrics(
        self, model: str, prompt_tokens: int, before: MetricsSnapshot
    ) -> tuple[int | _TieredHit | None, Any, str | None]:
        """The call's hits as the move of the server's counters, when only this call moved them."""
        after: MetricsSnapshot | None = None
        with anyio.move_on_after(METRICS_SETTLE_S):
            while True:
                after = await self._quiet_snapshot(model)
                moved = _moved(before.prompt_tokens, after.prompt_tokens if after else None)
                if after is None or moved is None or moved >= prompt_tokens:
                    break
                await anyio.sleep(0.02)  # the engine publishes stats a moment after replying
        if after is None:
            return None, "unavailable", "/metrics could not be read after the call"
        moved = _moved(before.prompt_tokens, after.prompt_tokens)
        hits = _moved(before.prefix_cache_hits_tokens, after.prefix_cache_hits_tokens)
        # vllm:prefix_cache_hits_total counts vLLM's own cache only; a KV connector's loads
        # (the engine, LMCache) move the external counter instead, and belong to the hit too.
        external = _moved(
            before.external_prefix_cache_hits_tokens, after.external_prefix_cache_hits_tokens
        )
        if moved is None or hits is None:
            return None, "unavailable", "the server's /metrics lacks the prefix-cache counters"
        if moved != prompt_tokens:
            return (
                None,
                "unavailable",
                (
                    f"/metrics counted {moved} prompt tokens during this call of {prompt_tokens}: "
                    "other requests ran at the same time, so the hit count cannot be attributed"
                ),
            )
        return (
            hits if external is None else _TieredHit(hits + external, external),
            "metrics_delta",
            (
                "from the move of vllm:prefix_cache_hits_total across the call (vLLM runs without "
                "--enable-prompt-tokens-details)"
            ),
        )

    async def _post_json(self, path: str, body: dict[str, Any]) -> dict[str, Any] | Unavailable:
        try:
            reply = await self._http.post(self.root_url + path, json=body)
        except httpx2.HTTPError as exc:
            return self._down(exc)
        if 400 <= reply.status_code < 500:
            raise VllmRequestError(_error_text(reply), status=reply.status_code)
        if reply.status_code != 200:
            return Unavailable(
                f"vLLM at {self.root_url} answered HTTP {reply.status_code} on {path}",
                status=reply.status_code,
            )
        payload = reply.json()
        if not isinstance(payload, dict):
            return Unavailable(f"vLLM at {self.root_url} sent an unexpected {path} answer")
        return payload

    def _down(self, exc: Exception) -> Unavailable:
        return Unavailable(
            f"vLLM not reachable at {self.root_url} ({type(exc).__name__}); start it with "
            "vllm_start or check VLLM_BASE_URL"
        )

    def _failed(self, exc: openai.APIError) -> Unavailable:
        """Turn an openai error into a value, or raise when the request itself was wrong."""
        if isinstance(exc, openai.APIConnectionError):
            return self._down(exc)
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            if status in (401, 403):
                return Unavailable(
                    f"vLLM at {self.root_url} refused the API key (HTTP {status}); set "
                    "VLLM_API_KEY to the key the server was started with",
                    status=status,
                )
            if 400 <= status < 500:
                raise VllmRequestError(
                    f"vLLM refused the request (HTTP {status}): {_api_message(exc)}", status=status
                ) from None
            return Unavailable(
                f"vLLM at {self.root_url} failed (HTTP {status}): {_api_message(exc)}",
                status=status,
            )
        return Unavailable(f"vLLM call failed: {type(exc).__name__}")


@dataclass(frozen=True, slots=True)
class _TieredHit:
    """A hit count from /metrics that knows its external (KV connector) part."""

    total: int
    external: int


def _moved(before: int | None, after: int | None) -> int | None:
    return None if before is None or after is None else after - before


def _api_message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        message = body.get("message") or body.get("error", {})
        if isinstance(message, dict):
            message = message.get("message")
        if message:
            return str(message)[:500]
    return exc.message[:500]


def _error_text(reply: httpx2.Response) -> str:
    try:
        payload = reply.json()
    except ValueError:
        return f"HTTP {reply.status_code}: {reply.text[:300]}"
    if isinstance(payload, dict):
        error = payload.get("error", payload)
        message = error.get("message") if isinstance(error, dict) else error
        return f"HTTP {reply.status_code}: {str(message)[:300]}"
    return f"HTTP {reply.status_code}"
