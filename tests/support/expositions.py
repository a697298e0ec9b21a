"""Prometheus expositions for parser tests, derived from a real vLLM capture in tests/data/.

`vllm_metrics_single.prom` is a `/metrics` body from the tiny test model (one engine, after a few
requests). The variants here copy its `tiny-llama` series to other models and engines, scaling the
values so sums can be checked, or drop whole families as an older vLLM would not export them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data"
CAPTURED_MODEL = "tiny-llama"
_MODEL_LABEL = f'model_name="{CAPTURED_MODEL}"'


def captured() -> str:
    return (DATA / "vllm_metrics_single.prom").read_text()


def escape_label(value: str) -> str:
    """A label value as the text format writes it."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def widen(text: str, series: Sequence[tuple[str, str, int]]) -> str:
    """Replace every captured sample by one copy per (model, engine, factor), value × factor.

    `cache_config_info` (no model label) is copied once per distinct engine.
    """
    engines = sorted({engine for _model, engine, _factor in series})
    out: list[str] = []
    for line in text.split("\n"):
        if line.startswith("vllm:cache_config_info{"):
            out += [line.replace('engine="0"', f'engine="{engine}"') for engine in engines]
        elif not line.startswith("#") and _MODEL_LABEL in line:
            head, value = line.rsplit(" ", 1)
            for model, engine, factor in series:
                labels = head.replace(_MODEL_LABEL, f'model_name="{escape_label(model)}"')
                labels = labels.replace('engine="0"', f'engine="{engine}"')
                out.append(f"{labels} {float(value) * factor!r}")
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def drop_families(text: str, prefixes: Iterable[str]) -> str:
    """Remove every line (samples, HELP, TYPE) of the metrics whose names start with `prefixes`."""
    names = tuple(prefixes)
    kept = []
    for line in text.split("\n"):
        name = line.split(" ", 3)[2] if line.startswith("# ") else line.split("{", 1)[0]
        if not name.startswith(names):
            kept.append(line)
    return "\n".join(kept) + "\n"


def with_external_tier(text: str, *, queries: int, hits: int, engine_bytes: int | None) -> str:
    """The capture as a vLLM with a KV connector would export it: the external counters at
    `queries` / `hits`, and (when `engine_bytes` is given) EngineKVConnector's loaded-bytes
    counter, labelled like the captured model's other series."""
    labels = f'{{engine="0",{_MODEL_LABEL}}}'
    out = text.replace(
        f"vllm:external_prefix_cache_queries_total{labels} 0.0",
        f"vllm:external_prefix_cache_queries_total{labels} {float(queries)!r}",
    ).replace(
        f"vllm:external_prefix_cache_hits_total{labels} 0.0",
        f"vllm:external_prefix_cache_hits_total{labels} {float(hits)!r}",
    )
    if engine_bytes is not None:
        name = "graph_kvcache:engine_kv_loaded_bytes"
        out += (
            f"# HELP {name}_total Engine bytes read for the KV blocks EngineKVConnector loaded.\n"
            f"# TYPE {name}_total counter\n"
            f"{name}_total{labels} {float(engine_bytes)!r}\n"
        )
    return out
