"""Where one vLLM server answers: its root and, below it, its OpenAI API base.

vLLM serves /health, /metrics, /tokenize and /version at its root and the OpenAI routes under
`/v1`. Settings and state files hold the API base (`VLLM_BASE_URL`); the probes need the root.
One value carries both, so no caller strips or appends `/v1` by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

from graph_kvcache_mcp.domain.endpoints import parse_http_url

API_PATH = "/v1"


@dataclass(frozen=True, slots=True)
class VllmEndpoint:
    root: str
    """`scheme://host:port`, no trailing slash."""

    @property
    def api_base(self) -> str:
        """The OpenAI base URL: the root and `/v1`."""
        return self.root + API_PATH

    @property
    def metrics_url(self) -> str:
        return self.root + "/metrics"

    @classmethod
    def of(cls, base_url: str) -> VllmEndpoint:
        """The endpoint of an http(s) URL given with or without its trailing `/v1`.

        Raises:
            ConfigError: not an http(s) URL.
        """
        url = parse_http_url(base_url, what="VLLM_BASE_URL").url
        return cls(url.removesuffix(API_PATH))

    @classmethod
    def local(cls, host: str, port: int) -> VllmEndpoint:
        """A server this machine runs on `port` (a managed or a foreign one)."""
        return cls(f"http://{host}:{port}")
