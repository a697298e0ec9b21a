"""graph-kvcache-mcp: drive and inspect an LLM KV-cache stack from agents, scripts and the shell."""

from graph_kvcache_mcp.connectors.engine.client import KvClient, SyncKvClient
from graph_kvcache_mcp.domain.outcomes import Hit, Miss, Presence, Stored, Unavailable
from graph_kvcache_mcp.errors import (
    ConfigError,
    EngineProcessError,
    GraphKvcacheError,
    InvalidKey,
    InvalidValue,
    ProcessError,
    VllmProcessError,
)

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "EngineProcessError",
    "GraphKvcacheError",
    "Hit",
    "InvalidKey",
    "InvalidValue",
    "KvClient",
    "Miss",
    "Presence",
    "ProcessError",
    "Stored",
    "SyncKvClient",
    "Unavailable",
    "VllmProcessError",
    "__version__",
]
