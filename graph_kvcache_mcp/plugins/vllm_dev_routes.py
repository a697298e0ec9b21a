"""The filter a dev-mode vLLM runs behind (`--middleware <this module>.OwnerOnlyDevRoutes`).

`VLLM_SERVER_DEV_MODE=1` adds routes that run code in the workers (`/collective_rpc`), swap the
weights (`/update_weights`), put the engine to sleep, drop the prefix cache or describe the server
with its environment (`/server_info`); the RL routers come with them. vLLM's API key covers `/v1`
only, and the server listens on loopback TCP, where every local user can connect. So with dev
mode on, a request another user's process made is served only on the public routes below (the
OpenAI API, which the key still guards, and the probes); every other route, the dev ones and any
a later vLLM adds, answers 403 to them. Our own tools run as the owner and reach all of them.
"""

from __future__ import annotations

from typing import Any

from graph_kvcache_mcp.plugins.owner_only import from_owner, refuse

PUBLIC_PREFIXES = ("/v1/",)
"""vLLM's OpenAI API: guarded by its own key (`VLLM_API_KEY`) whatever the caller."""
PUBLIC_ROUTES = frozenset(
    {"/health", "/ping", "/version", "/metrics", "/load", "/tokenize", "/detokenize"}
)
"""Probes and the tokenizer: they run nothing in the workers and change no state."""


def is_public(path: str) -> bool:
    """Whether any local user may reach `path` of a dev-mode vLLM."""
    return path in PUBLIC_ROUTES or path.startswith(PUBLIC_PREFIXES)


class OwnerOnlyDevRoutes:
    """ASGI middleware: 403 to another user's request for any route but the public ones (a
    websocket from one is closed unanswered)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan" or (
            scope["type"] in ("http", "websocket")
            and (is_public(scope["path"]) or from_owner(scope))
        ):
            await self.app(scope, receive, send)
        elif scope["type"] == "http":
            await refuse(send, 403, "Forbidden: vLLM's dev routes serve their owner only")
