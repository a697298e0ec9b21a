"""A vLLM general plugin: every vLLM process on a CPU with AMX asks Linux for AMX tile state.

Registered as the `vllm.general_plugins` entry point `graph_kvcache_amx`, so vLLM runs
`request_amx_tiles` in each of its processes (API server, engine core, workers) once this package
is installed in vLLM's venv, with or without a KV connector. Why (measured in
`tools/bench_cold_prefill.py`): a process may execute AMX instructions only after asking for the
tile state (`arch_prctl(ARCH_REQ_XCOMP_PERM)`); vLLM's CPU attention kernel for bf16 KV in
32-token blocks uses AMX and leaves the request to an earlier bf16 matmul, so without it a fresh
process can die of SIGILL, and its cold prefill ran much slower. Asking again is harmless.
Imports only torch (vLLM's venv has it); never raises into vLLM.
"""

from __future__ import annotations

import logging

# Under "vllm." so that vLLM's own logging configuration prints it beside vLLM's lines.
logger = logging.getLogger("vllm.graph_kvcache.amx")

GRANTED_LINE = "graph-kvcache: AMX tile state granted to this vLLM process"
REFUSED_LINE = "graph-kvcache: the OS refused AMX tile state to this vLLM process"


def request_amx_tiles() -> bool:
    """Ask for AMX tile state where the CPU has AMX; True when this process may use AMX now."""
    try:
        import torch

        if not torch.cpu._is_amx_tile_supported():
            return False
        granted = bool(torch.cpu._init_amx())
    except Exception:  # a plugin must never stop vLLM from starting
        logger.exception("graph-kvcache: could not ask for AMX tile state")
        return False
    if granted:
        logger.debug(GRANTED_LINE)
    else:
        logger.warning(REFUSED_LINE)
    return granted
