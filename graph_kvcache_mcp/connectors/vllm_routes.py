"""vLLM's own routes beside the OpenAI API: `/health`, `/tokenize`, `/reset_prefix_cache`.

Plain httpx calls on the client's shared `httpx2.AsyncClient`; every answer is checked before it
is read (`connectors.vllm_errors`), so a proxy's page or a foreign shape is a bad answer.
"""

from __future__ import annotations

import anyio
import httpx2

from graph_kvcache_mcp.connectors import vllm_errors
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.domain.vllm_chat import PrefixCacheReset

HEALTH_TIMEOUT_S = 5.0
NO_DEV_MODE = (
    "the server has no /reset_prefix_cache route: vLLM only offers it with VLLM_SERVER_DEV_MODE=1 "
    "in its environment; restart it that way (vllm_start with dev_mode=true) to reset the prefix "
    "cache"
)


class VllmRoutes:
    """One server's own routes, through a shared `httpx2.AsyncClient` (not owned here)."""

    def __init__(self, http: httpx2.AsyncClient, root_url: str, *, timeout_s: float) -> None:
        self.root_url = root_url
        self.timeout_s = timeout_s
        self._http = http

    def __repr__(self) -> str:
        return f"VllmRoutes({self.root_url!r})"

    async def health(self) -> bool | Unavailable:
        """True when `GET /health` answers 200."""
        try:
            reply = await self._http.get(self.root_url + "/health", timeout=HEALTH_TIMEOUT_S)
        except httpx2.HTTPError as exc:
            return vllm_errors.from_transport(exc, self.root_url, HEALTH_TIMEOUT_S)
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
        reply = await self._post("/tokenize", body)
        if isinstance(reply, Unavailable):
            return reply
        payload = vllm_errors.json_object(reply, self.root_url, "/tokenize")
        if isinstance(payload, Unavailable):
            return payload
        count = payload.get("count")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            return vllm_errors.bad_answer(self.root_url, "/tokenize answered without a count")
        return count

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
            return vllm_errors.from_transport(exc, self.root_url, self.timeout_s)
