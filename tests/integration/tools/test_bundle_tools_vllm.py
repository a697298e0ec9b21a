"""bundle_chat and bundle_reuse_measure through an in-memory MCP Client on a real engine + vLLM."""

from __future__ import annotations

import json
import secrets

import pytest
from mcp import Client

from graph_kvcache_mcp.cli import main
from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.server import build_server
from graph_kvcache_mcp.services.bundle.reuse import ReuseReport
from graph_kvcache_mcp.services.bundle.views import BundleChatOut, BundleCompileOut
from tests.support.bundles import corpus
from tests.support.engines import RunningEngine
from tests.support.mcp_calls import MODES, call_ok
from tests.support.vllm import BLOCK_SIZE, RunningVllm

pytestmark = pytest.mark.vllm


def settings_for(engine: RunningEngine, vllm: RunningVllm) -> Settings:
    return Settings.build(
        kv_url=engine.base_url,
        kv_token=engine.token,
        vllm_base_url=vllm.base_url,
        vllm_model=vllm.model,
        data_dir=engine.managed.data_dir,
    )


def evidence() -> list[dict[str, object]]:
    return [i.model_dump(mode="json") for i in corpus(30, nonce=secrets.token_hex(6) + " ")]


@MODES
async def test_bundle_chat_second_turn_hits_the_prefix_the_first_turn_left(
    memory_engine: RunningEngine, vllm_server: RunningVllm, mode: str
) -> None:
    async with Client(build_server(settings_for(memory_engine, vllm_server)), mode=mode) as client:
        compiled = BundleCompileOut.model_validate(
            await call_ok(
                client,
                "bundle_compile",
                {"query": "block hash", "items": evidence(), "token_budget": 1500},
            )
        )
        # A preamble of its own: the default one (and the bundle header) is shared by every
        # bundle, so vLLM would serve those first blocks from earlier tests' calls.
        preamble = f"Session {secrets.token_hex(8)}. Answer from the evidence below."
        turns = [
            BundleChatOut.model_validate(
                await call_ok(
                    client,
                    "bundle_chat",
                    {
                        "key": compiled.key,
                        "turn_text": question,
                        "max_tokens": 2,
                        "system_preamble": preamble,
                    },
                )
            )
            for question in ("What is hashed?", "What is evicted?")
        ]
    assert compiled.token_counter == "vllm-tokenize/tiny-llama" and compiled.tokens_used <= 1500
    first, second = (turn.trace for turn in turns)
    assert first is not None and second is not None
    assert turns[0].system_sha256 == turns[1].system_sha256
    assert first.prefix_cache_hit_tokens == 0
    hit = second.prefix_cache_hit_tokens
    assert hit is not None and hit > 0 and hit % BLOCK_SIZE == 0
    assert second.cached_tokens_source == "usage"


@MODES
async def test_bundle_reuse_measure_reports_progress_and_matching_counts(
    memory_engine: RunningEngine, vllm_server: RunningVllm, mode: str
) -> None:
    seen: list[tuple[float, float | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total))

    arguments = {"bundles": 2, "items_per_bundle": 20, "token_budget": 800, "max_tokens": 1}
    async with Client(build_server(settings_for(memory_engine, vllm_server)), mode=mode) as client:
        result = await client.call_tool(
            "bundle_reuse_measure", arguments, progress_callback=on_progress
        )
    assert not result.is_error and result.structured_content is not None
    report = ReuseReport.model_validate(result.structured_content)
    assert report.reachable and report.summary is not None
    assert report.summary.usage_matches_metrics is True
    assert report.summary.cold_hit_tokens == 0 and report.summary.warm_hit_tokens > 0
    assert seen == [(n, 4) for n in range(1, 5)]


def test_bundle_chat_and_reuse_measure_cli_print_tool_shaped_json(
    memory_engine: RunningEngine,
    vllm_server: RunningVllm,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: object,
) -> None:
    monkeypatch.setenv("EPISTEMIC_GRAPH_KVCACHE_TOKEN", memory_engine.token.get_secret_value())
    path = memory_engine.managed.data_dir / f"evidence-{secrets.token_hex(4)}.jsonl"
    path.write_text("\n".join(json.dumps(item) for item in evidence()), encoding="utf-8")
    kv = ["--url", memory_engine.base_url]
    vllm = ["--base-url", vllm_server.base_url, "--model", vllm_server.model]

    assert main(["bundle", "compile", "--evidence", str(path), "--json", *kv, *vllm]) == 0
    compiled = BundleCompileOut.model_validate_json(capsys.readouterr().out)
    assert compiled.token_counter == "vllm-tokenize/tiny-llama"

    chat = ["bundle", "chat", compiled.key, "--turn", "q", "--max-tokens", "1", "--json"]
    assert main([*chat, *kv, *vllm]) == 0
    out = BundleChatOut.model_validate_json(capsys.readouterr().out)
    assert out.trace is not None and out.trace.prompt_tokens > 0

    measure = ["bundle", "reuse-measure", "--bundles", "1", "--items", "10", "--json", *vllm]
    assert main(measure) == 0
    report = ReuseReport.model_validate_json(capsys.readouterr().out)
    assert report.summary is not None and report.summary.calls == 2
