"""Every name of vLLM's source the project relies on, and the check that a vLLM still has them.

`EngineKVConnector` (`plugins/vllm_kv/`) subclasses vLLM's connector base and reads private
fields of the scheduler's output, the request, the KV cache config and the CPU attention backend;
the fleet reads vLLM's KV event structs by position; the metric snapshots read vLLM's metric
names. None of these is a public API, so a new vLLM can move one without a word. `check_seams`
reads a vLLM's module sources (from a wheel or an install, by `connectors/files/package_sources.py`;
never imported, so a GPU wheel is checked on a CPU host) and names each seam that moved.

Pure: source text in, results out.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from graph_kvcache_mcp.domain.fleet.events import REMOVED_FIELDS, STORED_FIELDS
from graph_kvcache_mcp.domain.vllm.metrics.names import (
    BY_SOURCE_SAMPLES,
    CACHE_CONFIG,
    COUNTER_SAMPLES,
    GAUGE_SAMPLES,
    TTFT,
)

BASE = "vllm/distributed/kv_transfer/kv_connector/v1/base.py"
CONNECTOR_METRICS = "vllm/distributed/kv_transfer/kv_connector/v1/metrics.py"
SCHED_OUTPUT = "vllm/v1/core/sched/output.py"
REQUEST = "vllm/v1/request.py"
KV_CACHE_INTERFACE = "vllm/v1/kv_cache_interface.py"
CPU_ATTENTION = "vllm/v1/attention/backends/cpu_attn.py"
ATTENTION_SELECTOR = "vllm/v1/attention/selector.py"
VLLM_CONFIG = "vllm/config/vllm.py"
PLATFORM = "vllm/platforms/interface.py"
KV_EVENTS = "vllm/distributed/kv_events.py"
METRIC_LOGGERS = "vllm/v1/metrics/loggers.py"
CACHE_HIT_SOURCE = "vllm/v1/metrics/cache_hit_source.py"
PARALLEL_STATE = "vllm/distributed/parallel_state.py"


@dataclass(frozen=True, slots=True)
class Seam:
    """A name `module` must define: at module level (`owner` None) or in class `owner` (a
    method, a field, a class attribute, or an attribute its methods set on `self`)."""

    module: str
    owner: str | None
    name: str
    use: str

    @property
    def label(self) -> str:
        return f"{self.module}:{self.owner + '.' if self.owner else ''}{self.name}"


@dataclass(frozen=True, slots=True)
class FieldOrder:
    """Class `owner` of `module` declares its fields in the order of `fields` (the positional
    wire): one list is a prefix of the other. An older vLLM may lack trailing fields (they decode
    as absent), a newer one may add some after them; one inserted before is a move."""

    module: str
    owner: str
    fields: tuple[str, ...]
    use: str

    @property
    def label(self) -> str:
        return f"{self.module}:{self.owner} field order"


@dataclass(frozen=True, slots=True)
class Literal:
    """A string `module` must contain (a metric name it registers)."""

    module: str
    text: str
    use: str

    @property
    def label(self) -> str:
        return f"{self.module}:{self.text!r}"


Check = Seam | FieldOrder | Literal


@dataclass(frozen=True, slots=True)
class SeamResult:
    check: Check
    found: bool
    detail: str = ""


def _members(module: str, owner: str | None, names: Sequence[str], use: str) -> list[Seam]:
    return [Seam(module, owner, name, use) for name in names]


_CONNECTOR = "EngineKVConnector subclasses it"
SEAMS: tuple[Check, ...] = (
    *_members(
        BASE,
        None,
        (
            "KVConnectorBase_V1",
            "KVConnectorMetadata",
            "KVConnectorRole",
            "KVConnectorTransferResults",
            "SupportsHMA",
        ),
        _CONNECTOR,
    ),
    *_members(
        BASE,
        "KVConnectorBase_V1",
        (
            "get_num_new_matched_tokens",
            "update_state_after_alloc",
            "build_connector_meta",
            "request_finished",
            "update_connector_output",
            "register_kv_caches",
            "start_load_kv",
            "wait_for_layer_load",
            "save_kv_layer",
            "wait_for_save",
            "get_block_ids_with_load_errors",
            "get_transfer_results",
            "bind_connector_metadata",
            "clear_connector_metadata",
            "requires_kv_delivery",
            "shutdown",
            "get_kv_connector_stats",
            "build_kv_connector_stats",
            "build_prom_metrics",
            "get_external_cache_hit_sources",
            "handle_preemptions",
        ),
        "EngineKVConnector overrides it",
    ),
    *_members(
        CACHE_HIT_SOURCE,
        "CacheHitSource",
        ("HOST", "DISK", "EXTERNAL_UNSPECIFIED"),
        "the tier engine hits count under (domain.vllm.engine_kv.hit_sources)",
    ),
    Seam(BASE, "SupportsHMA", "request_finished_all_groups", "hybrid saves end through it"),
    *_members(
        CONNECTOR_METRICS,
        None,
        ("KVConnectorStats", "KVConnectorPromMetrics"),
        "the connector's counters",
    ),
    Seam(CONNECTOR_METRICS, "KVConnectorPromMetrics", "_counter_cls", "the connector's counters"),
    Seam(CPU_ATTENTION, None, "_get_attn_isa", "the CPU ISA in the connector's KV identity"),
    Seam(ATTENTION_SELECTOR, None, "get_attn_backend", "a GPU's backend in the KV identity"),
    Seam(VLLM_CONFIG, None, "set_current_vllm_config", "asking the selector for that backend"),
    Seam(PLATFORM, "Platform", "get_device_capability", "a GPU's architecture in the identity"),
    *_members(
        PARALLEL_STATE,
        None,
        (
            "model_parallel_is_initialized",
            "get_tensor_model_parallel_rank",
            "get_tensor_model_parallel_world_size",
        ),
        "each worker's tensor-parallel rank, for its own keys",
    ),
    *_members(
        SCHED_OUTPUT,
        "SchedulerOutput",
        (
            "scheduled_new_reqs",
            "scheduled_cached_reqs",
            "num_scheduled_tokens",
            "preempted_req_ids",
            "finished_req_ids",
            "kv_connector_block_state",
        ),
        "the connector's scheduler side reads it",
    ),
    Seam(SCHED_OUTPUT, "KVConnectorBlockState", "boundary_state_offloads", "hybrid state saves"),
    *_members(
        SCHED_OUTPUT,
        "NewRequestData",
        ("req_id", "block_ids", "num_computed_tokens"),
        "which blocks a new request loads into",
    ),
    *_members(
        SCHED_OUTPUT,
        "CachedRequestData",
        ("req_ids", "new_block_ids", "num_computed_tokens", "resumed_req_ids"),
        "which blocks a running request saves",
    ),
    *_members(
        REQUEST,
        "Request",
        (
            "request_id",
            "all_token_ids",
            "cache_salt",
            "lora_request",
            "mm_features",
            "prompt_embeds",
            "skip_reading_prefix_cache",
        ),
        "the connector's block keys and what it refuses to cache",
    ),
    *_members(
        KV_CACHE_INTERFACE,
        "KVCacheConfig",
        ("num_blocks", "kv_cache_tensors", "kv_cache_groups", "kv_cache_layout"),
        "where each layer's pages lie",
    ),
    *_members(
        KV_CACHE_INTERFACE,
        "KVCacheTensor",
        ("offset", "layer_stride", "block_stride", "layers"),
        "where each layer's pages lie",
    ),
    *_members(
        KV_CACHE_INTERFACE,
        "MambaSpec",
        ("shapes", "dtypes", "mamba_cache_mode", "mamba_type"),
        "a hybrid's state pages",
    ),
    FieldOrder(KV_EVENTS, "BlockStored", STORED_FIELDS, "the fleet decodes array-encoded events"),
    FieldOrder(KV_EVENTS, "BlockRemoved", REMOVED_FIELDS, "the fleet decodes array-encoded events"),
    Seam(KV_EVENTS, None, "AllBlocksCleared", "the fleet's event tags"),
    *(
        Literal(METRIC_LOGGERS, name.removesuffix("_total"), "metric snapshots read it")
        for name in (*COUNTER_SAMPLES, *BY_SOURCE_SAMPLES, *GAUGE_SAMPLES, TTFT, CACHE_CONFIG)
        if name.startswith("vllm:") and not name.startswith("vllm:engine_kv")
    ),
)


def check_seams(
    sources: Mapping[str, str | None], seams: Sequence[Check] = SEAMS
) -> list[SeamResult]:
    """Each seam, found or not, in the vLLM whose module sources are `sources` (path inside the
    package → text; None: the module is missing)."""
    parsed: dict[str, _Module | None] = {}
    results = []
    for seam in seams:
        if seam.module not in parsed:
            text = sources.get(seam.module)
            parsed[seam.module] = None if text is None else _Module(text)
        module = parsed[seam.module]
        if module is None:
            results.append(SeamResult(seam, False, "module missing"))
            continue
        results.append(module.check(seam))
    return results


class _Module:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tree = ast.parse(text)
        self.classes = {n.name: n for n in self.tree.body if isinstance(n, ast.ClassDef)}

    def check(self, seam: Check) -> SeamResult:
        match seam:
            case Literal():
                found = f'"{seam.text}"' in self.text or f"'{seam.text}'" in self.text
                return SeamResult(seam, found, "" if found else "name not registered")
            case FieldOrder():
                cls = self.classes.get(seam.owner)
                if cls is None:
                    return SeamResult(seam, False, "class missing")
                fields = tuple(_annotated(cls))
                common = min(len(fields), len(seam.fields))
                ok = fields[:common] == seam.fields[:common]
                return SeamResult(seam, ok, "" if ok else f"declares {list(fields)}")
            case Seam(owner=None):
                found = seam.name in _defined(self.tree.body)
                return SeamResult(seam, found, "" if found else "not defined")
            case Seam():
                assert seam.owner is not None
                cls = self.classes.get(seam.owner)
                if cls is None:
                    return SeamResult(seam, False, "class missing")
                found = seam.name in _defined(cls.body) | _self_attributes(cls)
                return SeamResult(seam, found, "" if found else "not in the class")


def _defined(body: Sequence[ast.stmt]) -> set[str]:
    names: set[str] = set()
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _annotated(cls: ast.ClassDef) -> list[str]:
    return [
        n.target.id
        for n in cls.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    ]


def _self_attributes(cls: ast.ClassDef) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(cls):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
            ):
                names.add(target.attr)
    return names
