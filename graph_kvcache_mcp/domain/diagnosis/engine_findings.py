"""Findings about the epistemic-graph engine, from what it answered. Pure: no I/O."""

from __future__ import annotations

from graph_kvcache_mcp.domain.diagnosis.stack_facts import EngineFacts, Finding
from graph_kvcache_mcp.domain.engine.environment import KV_TOKEN_ENV


def engine_findings(facts: EngineFacts) -> list[Finding]:
    """What is wrong with the engine: a refused token, no answer, or a memory-only backend."""
    if facts.status in (401, 403):
        return [
            Finding(
                id="engine_auth_failed",
                severity="error",
                component="engine",
                evidence=f"{facts.target} refused the token (HTTP {facts.status})",
                fix=f"set {KV_TOKEN_ENV} to the token the engine was started with",
            )
        ]
    if not facts.reachable:
        if facts.source == "default":
            return [
                Finding(
                    id="engine_not_started",
                    severity="info",
                    component="engine",
                    evidence=f"no engine configured or running ({facts.reason})",
                    fix="nothing to do for the MCP server: it starts a local engine on first "
                    "use; `graph-kvcache-mcp engine start` starts one for other clients",
                )
            ]
        return [
            Finding(
                id="engine_unreachable",
                severity="error",
                component="engine",
                evidence=facts.reason or f"{facts.target} did not answer",
                fix="start the engine (engine_start) or fix EPISTEMIC_GRAPH_KVCACHE_URL",
            )
        ]
    if facts.backend == "memory":
        return [
            Finding(
                id="engine_memory_backend",
                severity="warning",
                component="engine",
                evidence=f"{facts.target} runs the memory backend",
                fix="nothing survives a restart: start the engine with the durable backend "
                "(engine_start backend=durable) for a cache that outlives the process",
            )
        ]
    return []
