"""Local ports for the verbs that bind or hand out one themselves (`serve --transport http`
checks its port before binding, the demo picks its vLLM's): the processes layer's own checks,
offered here so no adapter reaches a process connector."""

from __future__ import annotations

from graph_kvcache_mcp.connectors.processes.ports import free_port, port_in_use

__all__ = ["free_port", "port_in_use"]
