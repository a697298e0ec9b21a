"""What is misconfigured in the KV-cache stack, from what each component reported. Pure: no I/O.

`stack_findings` runs each component's rules (`engine_findings`, `vllm_findings`,
`lmcache_findings`) and the ones that span two components (a hash seed both must share, the
MP connector's far end, the versions to quote), errors first. The facts and the finding models
live in `stack_facts` and are re-exported here, where callers import them.
"""

from __future__ import annotations

from graph_kvcache_mcp.domain.diagnosis.engine_findings import engine_findings
from graph_kvcache_mcp.domain.diagnosis.lmcache_findings import (
    LMCACHE_DRIVEN,
    MP_CONNECTOR,
    lmcache_findings,
    mp_stack_findings,
)
from graph_kvcache_mcp.domain.diagnosis.stack_facts import (
    Checked,
    Component,
    EngineFacts,
    Finding,
    LmcacheFacts,
    Severity,
    StackDiagnosis,
    VllmFacts,
)
from graph_kvcache_mcp.domain.diagnosis.vllm_findings import KV_PRESSURE_USAGE, vllm_findings
from graph_kvcache_mcp.domain.lmcache.config import MP_CONNECTOR_CLASS

__all__ = [
    "KV_PRESSURE_USAGE",
    "LMCACHE_DRIVEN",
    "MP_CONNECTOR",
    "Checked",
    "Component",
    "EngineFacts",
    "Finding",
    "LmcacheFacts",
    "Severity",
    "StackDiagnosis",
    "VllmFacts",
    "mp_stack_findings",
    "stack_findings",
]


def stack_findings(
    engine: EngineFacts | None, vllm: VllmFacts | None, lmcache: LmcacheFacts | None
) -> StackDiagnosis:
    """The findings for what was checked, errors first."""
    findings: list[Finding] = []
    checked: list[Checked] = []
    if engine is not None:
        checked.append(
            Checked(component="engine", target=engine.target, reachable=engine.reachable)
        )
        findings += engine_findings(engine)
    if vllm is not None:
        checked.append(Checked(component="vllm", target=vllm.target, reachable=vllm.reachable))
        findings += vllm_findings(_with_lmcache_lookups(vllm, lmcache))
    if lmcache is not None:
        checked.append(
            Checked(component="lmcache", target=lmcache.target, reachable=lmcache.reachable)
        )
        findings += lmcache_findings(lmcache)
    findings += _hash_seed(vllm, lmcache)
    findings += _not_readable(vllm, lmcache)
    findings += mp_stack_findings(vllm, lmcache)
    findings += _versions(vllm, lmcache)
    order = {"error": 0, "warning": 1, "info": 2}
    findings.sort(key=lambda f: order[f.severity])
    return StackDiagnosis(findings=findings, checked=checked)


def _with_lmcache_lookups(vllm: VllmFacts, lmcache: LmcacheFacts | None) -> VllmFacts:
    """`vllm` with what LMCache was asked and held, when vLLM's connector is LMCache's MP one
    (the server checked is then the one it asks)."""
    if lmcache is None or lmcache.lookup_tokens is None or vllm.kv_connector != MP_CONNECTOR_CLASS:
        return vllm
    return vllm.model_copy(
        update={
            "connector_lookup_tokens": lmcache.lookup_tokens,
            "connector_found_tokens": lmcache.found_tokens,
        }
    )


def _hash_seed(vllm: VllmFacts | None, lmcache: LmcacheFacts | None) -> list[Finding]:
    # Only a vLLM with a KV connector shares hashes with another process.
    if vllm is None or not vllm.reachable or vllm.kv_connector is None:
        return []
    seeds = {"vLLM": vllm.hash_seed}
    if lmcache is not None and lmcache.hash_seed is not None:  # known only for ours
        seeds["LMCache"] = lmcache.hash_seed
    unset = [name for name, seed in seeds.items() if seed is None]
    if not unset and len(set(seeds.values())) == 1:
        return []
    shown = ", ".join(f"{name}={seed or 'unset'}" for name, seed in seeds.items())
    return [
        Finding(
            id="hash_seed_mismatch",
            severity="warning",
            component="vllm",
            evidence=f"PYTHONHASHSEED {shown} (kv_connector {vllm.kv_connector})",
            fix="start vLLM and LMCache with the same PYTHONHASHSEED (e.g. 0): otherwise their "
            "chunk hashes differ and the external cache never hits",
        )
    ]


def _not_readable(vllm: VllmFacts | None, lmcache: LmcacheFacts | None) -> list[Finding]:
    """What was not checked because it lives with a process another host or user runs: said,
    so that no finding's absence reads as "checked and fine"."""
    return [
        Finding(
            id="runtime_not_readable",
            severity="info",
            component=component,
            evidence=facts.not_readable,
            fix="compare PYTHONHASHSEED and the transfer mode of vLLM and the lmcache server "
            "where they run (they must agree), or start them from this data dir to have them "
            "checked here",
        )
        for component, facts in (("vllm", vllm), ("lmcache", lmcache))
        if facts is not None and facts.reachable and facts.not_readable is not None
    ]


def _versions(vllm: VllmFacts | None, lmcache: LmcacheFacts | None) -> list[Finding]:
    parts = []
    if vllm is not None and vllm.version:
        parts.append(f"vLLM {vllm.version}")
    if lmcache is not None and lmcache.version:
        parts.append(f"LMCache {lmcache.version}")
    if not parts:
        return []
    return [
        Finding(
            id="versions",
            severity="info",
            component="vllm" if vllm is not None and vllm.version else "lmcache",
            evidence=", ".join(parts),
            fix="nothing to fix; quote these when reporting a problem",
        )
    ]
