"""`graph-kvcache-mcp bundle compile|render` on a real engine: JSONL in, tool-shaped JSON out."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from graph_kvcache_mcp.cli import main
from graph_kvcache_mcp.domain.bundle import DEFAULT_PREAMBLE
from graph_kvcache_mcp.services.bundle.views import BundleCompileOut, BundleRenderOut
from tests.support.bundles import corpus
from tests.support.engines import RunningEngine


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def evidence_file(tmp_path: Path) -> Path:
    path = tmp_path / "evidence.jsonl"
    items = corpus(25, nonce=secrets.token_hex(6) + " ")
    path.write_text("\n".join(item.model_dump_json() for item in items) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def engine_env(memory_engine: RunningEngine, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setenv("EPISTEMIC_GRAPH_KVCACHE_TOKEN", memory_engine.token.get_secret_value())
    return ["--url", memory_engine.base_url]


def test_bundle_compile_twice_misses_then_hits_and_render_uses_the_key(
    capsys: pytest.CaptureFixture[str], evidence_file: Path, engine_env: list[str]
) -> None:
    argv = ["bundle", "compile", "--evidence", str(evidence_file), "--query", "eviction"]
    argv += ["--budget", "600", "--top-k", "6", "--weights", "0.5,0.3,0.2", *engine_env]
    code, out, _ = run(capsys, *argv, "--json")
    first = BundleCompileOut.model_validate_json(out)
    assert code == 0 and (first.cache, first.assembled) == ("miss", True)

    code, out, _ = run(capsys, *argv, "--json", "--text")
    second = BundleCompileOut.model_validate_json(out)
    assert code == 0 and (second.cache, second.kv_cache_hit, second.assembled) == (
        "hit",
        True,
        False,
    )
    assert second.key == first.key and second.text is not None

    code, out, _ = run(
        capsys, "bundle", "render", first.key, "--turn", "why?", "--json", *engine_env
    )
    rendered = BundleRenderOut.model_validate_json(out)
    assert code == 0
    assert rendered.messages[0].content == DEFAULT_PREAMBLE + "\n\n" + second.text
    assert rendered.messages[1].content == "why?"

    code, out, _ = run(capsys, *argv)
    assert code == 0 and out.startswith(first.key) and "cache hit" in out


def test_bundle_render_of_an_unknown_key_exits_1(
    capsys: pytest.CaptureFixture[str], engine_env: list[str]
) -> None:
    key = "ctxbundle:" + secrets.token_hex(32)
    code, out, _ = run(capsys, "bundle", "render", key, "--turn", "q", *engine_env)
    assert code == 1 and out.startswith("not found")


def test_bundle_compile_without_cache_needs_no_store(
    capsys: pytest.CaptureFixture[str], evidence_file: Path
) -> None:
    argv = ["bundle", "compile", "--evidence", str(evidence_file), "--no-cache", "--json"]
    code, out, _ = run(capsys, *argv, "--url", "http://127.0.0.1:9")
    result = json.loads(out)
    assert code == 0 and (result["cache"], result["store_reachable"]) == ("off", None)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("not json", "evidence line 2 is not JSON"),
        ("[1, 2]", "evidence line 2 is not a JSON object"),
        ('{"id": "x"}', "items.1.text"),
    ],
)
def test_bad_evidence_lines_exit_2_with_the_line_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, line: str, expected: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "ok", "text": "fine"}\n' + line + "\n", encoding="utf-8")
    code, out, err = run(capsys, "bundle", "compile", "--evidence", str(path), "--no-cache")
    assert code == 2 and out == ""
    assert expected in err and "Traceback" not in err


def test_bad_weights_exit_2(capsys: pytest.CaptureFixture[str], evidence_file: Path) -> None:
    argv = ["bundle", "compile", "--evidence", str(evidence_file), "--no-cache"]
    code, _, err = run(capsys, *argv, "--weights", "1,2")
    assert code == 2 and "three numbers" in err
