"""The device copy path's tests import torch and vLLM, which the test venv lacks: they run in
the vLLM venv, started from the main suite by `tests/unit/plugins/vllm_kv/test_device_suite.py`,
and are collected only where torch and vLLM import."""

from __future__ import annotations

import importlib.util

collect_ignore_glob = (
    [] if importlib.util.find_spec("torch") and importlib.util.find_spec("vllm") else ["test_*.py"]
)
