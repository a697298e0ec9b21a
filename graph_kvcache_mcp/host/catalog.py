"""The toolsets this server knows: one table that config, the server and the `toolsets` tool read.

A row says where the toolset's module is (imported only when a server offers it: a host waits for
start-up, and opt-in toolsets need not load for a server that does not list them), whether a
server has it by default, which endpoints it talks to (a refused one disables the toolset, not
the server), its line for the `toolsets` tool and its part of the server's instructions. The
table's order is the order of the default tools/list, of the instructions and of the catalog.
`toolsets`, the tool that enables the others at run time, is the one row without a module.

A leaf: it imports nothing of the package, so `config` can read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Endpoint = Literal["kv", "vllm"]


@dataclass(frozen=True, slots=True)
class ToolsetEntry:
    name: str
    module: str | None
    """The `tools/<area>.py` module registering it; None for the `toolsets` tool itself."""
    default: bool
    """Registered unless GRAPH_KVCACHE_TOOLSETS says otherwise; else opt-in."""
    endpoints: tuple[Endpoint, ...] = ()
    summary: str = ""
    instructions: str = ""


CATALOG: tuple[ToolsetEntry, ...] = (
    ToolsetEntry(
        name="kv",
        module="graph_kvcache_mcp.tools.kv",
        default=True,
        endpoints=("kv",),
        summary="the engine's KV store: stats, probe, get, exists, save, put",
        instructions="""\
KV store (kv_*): the epistemic-graph engine's content-addressed store. Start
with kv_stats (read-only: counters; pass an earlier result's snapshot_id as `since` to see what
moved); kv_probe also writes two canary keys. kv_get reads keys (size and sha256; bytes only
when asked and small), kv_exists checks many keys at once, kv_save writes one value to a new
file, kv_put stores bytes: the first value stored under a key wins, so a repeat PUT reports
already_present and changes nothing.""",
    ),
    ToolsetEntry(
        name="compat",
        module="graph_kvcache_mcp.tools.compat",
        default=True,
        endpoints=("kv",),
        summary="graph_kvcache, the single action tool older agents call",
        instructions="""\
graph_kvcache: the single action tool older agents call (get, put, contains/exists, stats).""",
    ),
    ToolsetEntry(
        name="engine",
        module="graph_kvcache_mcp.tools.engine",
        default=True,
        endpoints=("kv",),
        summary="the managed local engine: status, start, stop",
        instructions="""\
Engine (engine_*): with nothing configured the server runs its own local engine, started on
first KV use; engine_status shows it.""",
    ),
    ToolsetEntry(
        name="vllm",
        module="graph_kvcache_mcp.tools.vllm",
        default=True,
        endpoints=("vllm",),
        summary="chat with cache accounting, /metrics, a managed vLLM",
        instructions="""\
vLLM (vllm_*): vllm_chat returns the answer and a trace of prompt tokens served from vLLM's
prefix cache (cached_tokens_source says where the count came from, never 0 for unknown);
vllm_metrics reads /metrics (pass an earlier snapshot_id as `since` for a delta);
vllm_start/vllm_status/vllm_stop manage a local server; vllm_trace_summary sums up this
session's calls or a JSONL trace file.""",
    ),
    ToolsetEntry(
        name="bundle",
        module="graph_kvcache_mcp.tools.bundle",
        default=True,
        endpoints=("kv", "vllm"),
        summary="context bundles: compile, render, chat, measure reuse",
        instructions="""\
Context bundles (bundle_*): bundle_compile selects evidence under a token budget and caches it
by content (an edit gives a new key); bundle_render and bundle_chat reuse it as a byte-stable
prefix.""",
    ),
    ToolsetEntry(
        name="diagnose",
        module="graph_kvcache_mcp.tools.diagnose",
        default=True,
        endpoints=(),
        summary="why a request missed, stack checks, KV budgets",
        instructions="""\
Diagnosis (diagnose_*, read-only): diagnose_stack checks engine, vLLM and LMCache settings in
one call and says what is missing; diagnose_miss says why a request missed vLLM's prefix cache;
diagnose_budget sizes a model's KV cache from its config.json.""",
    ),
    ToolsetEntry(
        name="lmcache",
        module="graph_kvcache_mcp.tools.lmcache",
        default=False,
        endpoints=("kv",),
        summary="LMCache config for the engine as its remote tier, adapter check",
        instructions="""\
LMCache (lmcache_*): lmcache_config generates lmcache server / vLLM / YAML config with the
engine as LMCache's remote tier; lmcache_check validates the adapter against the engine.""",
    ),
    ToolsetEntry(
        name="fleet",
        module="graph_kvcache_mcp.tools.fleet",
        default=False,
        endpoints=(),
        summary="several vLLMs through their KV event feeds",
        instructions="""\
Fleet (fleet_*, read-only): several vLLM instances seen through their KV event feeds:
fleet_status (who can share, who is under pressure, the index), fleet_where_cached (where a
prompt's prefix is cached), fleet_effectiveness (prompt tokens by source over a window).""",
    ),
    ToolsetEntry(
        name="cache",
        module="graph_kvcache_mcp.tools.cache",
        default=False,
        endpoints=(),
        summary="warm, evict, pin a prompt on an instance's LMCache server",
        instructions="""\
Cache steering (cache_*, writes): cache_warm, cache_evict, cache_pin, cache_unpin act on one fleet
instance's LMCache server through LMCache's coordinator; the engine (L2) never deletes.""",
    ),
    ToolsetEntry(name="toolsets", module=None, default=True),
)

TOOLSETS = tuple(entry.name for entry in CATALOG)
DEFAULT_TOOLSETS = tuple(entry.name for entry in CATALOG if entry.default)
"""`toolsets` is the one tool that lists the others and enables an opt-in one at run time."""
TOOLSET_MODULES = {entry.name: entry.module for entry in CATALOG if entry.module is not None}
"""The toolsets with tools of their own, by name: what the catalog lists and a server offers."""


def entry_of(name: str) -> ToolsetEntry | None:
    return next((entry for entry in CATALOG if entry.name == name), None)
