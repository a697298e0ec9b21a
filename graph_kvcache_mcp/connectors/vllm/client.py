"""A vLLM client whose chat and completion calls each return a `ChatResult` (answer + `Trace`).

Built on the official `openai` async client with one shared `httpx2.AsyncClient`, which also
serves vLLM's own routes (`/tokenize`, `/metrics`, `/reset_prefix_cache`, `/health`).
The openai client validates every answer against its types (a proxy's HTML page or a foreign
JSON shape is a bad answer, not a crash) and never retries by itself: a chat call that timed out
may have reached vLLM, and a repeat would be a second call.

`timeout_s` bounds a plain call's whole answer and, for a streamed call, the gap between chunks;
`tls`: a fleet's mutual TLS (`connectors.net.tls_client`) for a vLLM on another host.
`probe_timeout_s` (never more than `timeout_s`) bounds /health, /metrics and /v1/models, which a
working vLLM answers in milliseconds (`domain.vllm.deadlines`). Failures become `Unavailable`
values (`connectors.vllm.errors` says which of three reasons).
The call's cached tokens are credited by its `CacheMeter` (`connectors.vllm.accounting`): from
the answer's usage, else from /metrics around the call, by the rule in `domain.vllm.chat`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Self

import anyio
import httpx2
import openai
from pydantic import SecretStr

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.net.tls_trust import ClientTls
from graph_kvcache_mcp.connectors.vllm import errors as vllm_errors
from graph_kvcache_mcp.connectors.vllm.accounting import CacheMeter
from graph_kvcache_mcp.connectors.vllm.chat_requests import (
    CompletionRequest,
    Request,
    chat_request,
    failure_of,
    streamed_answer,
    whole_answer,
)
from graph_kvcache_mcp.connectors.vllm.metrics import VllmMetricsClient
from graph_kvcache_mcp.connectors.vllm.routes import VllmRoutes
from graph_kvcache_mcp.domain.bundle import ChatMessage
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.domain.vllm.chat import (
    DEFAULT_MAX_TOKENS,
    ChatResult,
    PrefixCacheReset,
)
from graph_kvcache_mcp.domain.vllm.deadlines import (
    DEFAULT_CALL_TIMEOUT_S,
    DEFAULT_PROBE_TIMEOUT_S,
    PROBE_TIMEOUT_ENV,
    probe_deadline_s,
)
from graph_kvcache_mcp.domain.vllm.endpoint import VllmEndpoint
from graph_kvcache_mcp.domain.vllm.traces import Trace, cache_split
from graph_kvcache_mcp.errors import VllmRequestError

_NO_KEY = "EMPTY"  # vLLM without --api-key accepts any bearer; openai insists on one


class VllmClient:
    """One vLLM server. Use as `async with VllmClient(url) as client:` or call `aclose()`."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: SecretStr | None = None,
        timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        probe_timeout_s: float = DEFAULT_PROBE_TIMEOUT_S,
        max_retries: int = 0,
        metrics_fallback: bool = True,
        transport: httpx2.AsyncBaseTransport | None = None,
        tls: ClientTls | None = None,
    ) -> None:
        self.endpoint = VllmEndpoint.of(base_url)  # validates: http or https
        self.root_url = self.endpoint.root
        self.base_url = self.endpoint.api_base
        self.timeout_s = timeout_s
        self.probe_timeout_s = probe_deadline_s(probe_timeout_s, timeout_s)
        headers = {"Authorization": f"Bearer {api_key.get_secret_value()}"} if api_key else {}
        self._http = httpx2.AsyncClient(
            timeout=httpx2.Timeout(timeout_s, connect=min(timeout_s, 5.0)),
            headers=headers,
            transport=transport,
            verify=True if tls is None else tls.context,
        )
        self._openai = openai.AsyncOpenAI(
            api_key=api_key.get_secret_value() if api_key else _NO_KEY,
            base_url=self.base_url,
            timeout=timeout_s,
            max_retries=max_retries,
            http_client=self._http,
            _strict_response_validation=True,
        )
        self._trusted = trusted = None if tls is None else tls.trusted
        self.metrics = VllmMetricsClient(
            self._http, self.endpoint.metrics_url, timeout_s=self.probe_timeout_s, trusted=trusted
        )
        self.meter = CacheMeter(self.metrics, fallback=metrics_fallback)
        self.routes = VllmRoutes(
            self._http,
            self.root_url,
            timeout_s=timeout_s,
            probe_timeout_s=self.probe_timeout_s,
            trusted=trusted,
        )
        self._models: list[str] | None = None

    @classmethod
    def from_settings(cls, settings: Settings, *, base_url: str | None = None) -> Self:
        return cls(
            base_url or settings.vllm_base_url,
            api_key=settings.vllm_api_key,
            timeout_s=settings.vllm_timeout_s,
            probe_timeout_s=settings.vllm_probe_timeout_s,
        )

    def __repr__(self) -> str:
        return f"VllmClient({self.base_url!r})"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self.meter.tier is not None:
            await self.meter.tier.aclose()
        await self._openai.close()
        await self._http.aclose()

    @property
    def closed(self) -> bool:
        return self._http.is_closed

    # --- server facts ------------------------------------------------------------------------

    async def health(self) -> bool | Unavailable:
        """True when `GET /health` answers 200."""
        return await self.routes.health()

    async def models(self) -> list[str] | Unavailable:
        """The served model names (`GET /v1/models`)."""
        page = await self._model_page()
        if isinstance(page, Unavailable):
            return page
        self._models = [model.id for model in page]
        return list(self._models)

    async def model_roots(self) -> dict[str, str] | Unavailable:
        """Served name -> the model vLLM loaded (`root`, its --model): LMCache keys use it."""
        page = await self._model_page()
        if isinstance(page, Unavailable):
            return page
        return {model.id: str(getattr(model, "root", None) or model.id) for model in page}

    async def _model_page(self) -> list[openai.types.Model] | Unavailable:
        """`GET /v1/models`'s entries, within the probe deadline."""
        try:
            with anyio.fail_after(self.probe_timeout_s):
                page = await self._openai.models.list()
        except TimeoutError:
            return vllm_errors.timed_out(
                self.root_url, self.probe_timeout_s, knob=PROBE_TIMEOUT_ENV
            )
        except openai.APIError as exc:
            return self._failed(exc)
        except ValueError as exc:  # a JSON content type over a body that is not JSON
            return vllm_errors.bad_answer(self.root_url, f"/v1/models: {type(exc).__name__}")
        return list(page.data)

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
        messages: Sequence[ChatMessage],
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
        request = chat_request(list(messages), max_tokens=max_tokens, temperature=temperature)
        return await self._call(request, model=model, stream=stream)

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
        request = CompletionRequest(prompt, max_tokens, temperature)
        return await self._call(request, model=model, stream=stream)

    async def tokenize(
        self,
        text: str | None = None,
        *,
        messages: Sequence[ChatMessage] | None = None,
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
        body: dict[str, object] = {"model": chosen}
        if text is not None:
            body["prompt"] = text
        else:
            body["messages"] = [m.model_dump() for m in messages or ()]
            body["add_generation_prompt"] = True
        return await self.routes.token_count(body)

    async def reset_prefix_cache(self) -> PrefixCacheReset | Unavailable:
        """Drop every cached prefix block (`POST /reset_prefix_cache`, a dev-mode route)."""
        return await self.routes.reset_prefix_cache()

    # --- internals ---------------------------------------------------------------------------

    async def _call(
        self, request: Request, *, model: str | None, stream: bool
    ) -> ChatResult | Unavailable:
        chosen = await self.resolve_model(model)
        if isinstance(chosen, Unavailable):
            return chosen
        before = await self.meter.before_call(chosen)
        started_at = time.time()
        start = time.perf_counter()
        try:
            if stream:
                answer = await streamed_answer(
                    self._openai, request, chosen, start=start, timeout_s=self.timeout_s
                )
                if answer is None:
                    return vllm_errors.bad_answer(self.root_url, "a streamed answer with no chunk")
            else:
                with anyio.fail_after(self.timeout_s):
                    answer = await whole_answer(self._openai, request, chosen)
        except TimeoutError:
            return vllm_errors.timed_out(self.root_url, self.timeout_s, streamed=stream)
        except openai.APIError as exc:
            return self._failed(exc, streamed=stream)
        except ValueError as exc:  # a JSON content type (or SSE event) over a body that is not JSON
            return vllm_errors.bad_answer(self.root_url, f"not JSON: {type(exc).__name__}")
        if isinstance(answer, Unavailable):
            return answer
        latency = time.perf_counter() - start
        usage = answer.usage
        prompt_tokens = usage.prompt_tokens if usage else 0
        details = usage.prompt_tokens_details if usage is not None else None
        cached = await self.meter.credit(
            chosen,
            prompt_tokens=prompt_tokens,
            reported=details.cached_tokens if details is not None else None,
            answered_usage=usage is not None,
            start=before,
        )
        hit_tokens, miss_tokens = cache_split(prompt_tokens, cached.hit_tokens)
        trace = Trace(
            model=chosen,
            prompt_tokens=prompt_tokens,
            completion_tokens=usage.completion_tokens if usage else 0,
            prefix_cache_hit_tokens=hit_tokens,
            prefix_cache_miss_tokens=miss_tokens,
            external_cache_hit_tokens=cached.external_tokens,
            external_bytes_read=cached.external_bytes,
            lmcache_l1_hit_tokens=cached.l1_tokens,
            lmcache_l2_hit_tokens=cached.l2_tokens,
            lmcache_p2p_hit_tokens=cached.p2p_tokens,
            cached_tokens_source=cached.source,
            latency_s=latency,
            ttft_s=answer.ttft_s,
            stream=stream,
            finish_reason=answer.finish_reason,
            started_at=started_at,
            note=cached.note,
        )
        return ChatResult(answer=answer.text, trace=trace)

    def _failed(self, exc: openai.APIError, *, streamed: bool = False) -> Unavailable:
        """Raises VllmRequestError when the request itself was wrong (see `vllm_errors`)."""
        try:
            return failure_of(
                exc, self.root_url, self.timeout_s, streamed=streamed, trusted=self._trusted
            )
        except VllmRequestError as refused:
            raise refused from None  # the openai traceback adds nothing for the caller
