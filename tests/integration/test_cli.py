"""The shell surface: `engine` and `kv` commands on a real managed engine, exit codes, --json."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from graph_kvcache_mcp.cli import main
from graph_kvcache_mcp.domain.outcomes import Presence

if TYPE_CHECKING:
    from tests.support.engines import RunningEngine


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_engine_and_kv_commands_work_end_to_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("EPISTEMIC_GRAPH_KVCACHE_URL", "EPISTEMIC_GRAPH_KVCACHE_ADDR"):
        monkeypatch.delenv(name, raising=False)
    data = ["--data-dir", str(tmp_path)]
    code, out, _ = run(capsys, "engine", "start", "--backend", "memory", "--json", *data)
    assert code == 0
    started = json.loads(out)
    assert started["running"] and started["reachable"]
    try:
        value_file = tmp_path / "v.bin"
        value_file.write_bytes(b"\x00\x01payload")
        code, out, _ = run(capsys, "kv", "put", "blk:1", str(value_file), "--json", *data)
        assert code == 0 and json.loads(out)["state"] == "stored_new"

        code, out, _ = run(capsys, "kv", "put", "blk:1", str(value_file), *data)
        assert code == 0 and "already_present" in out and "NOT stored" in out

        out_file = tmp_path / "back.bin"
        code, _, _ = run(capsys, "kv", "get", "blk:1", "-o", str(out_file), *data)
        assert code == 0 and out_file.read_bytes() == b"\x00\x01payload"

        code, out, _ = run(capsys, "kv", "get", "blk:missing", "--json", *data)
        assert code == 1 and json.loads(out) == {**json.loads(out), "hit": False, "reachable": True}

        code, out, _ = run(capsys, "kv", "exists", "blk:1", "blk:missing", "--json", *data)
        assert code == 1 and json.loads(out)["present_count"] == 1

        code, out, _ = run(capsys, "kv", "probe", "--json", *data)
        probe = json.loads(out)
        assert code == 0 and probe["passed"], probe
        assert {c["name"] for c in probe["checks"]} == {
            "reachable",
            "auth",
            "round_trip",
            "dedup",
            "latency",
        }

        code, out, _ = run(capsys, "kv", "stats", "--json", *data)
        stats = json.loads(out)
        assert code == 0 and stats["backend"] == "memory"
        assert stats["engine"]["unique_blocks"] >= 2

        code, out, _ = run(capsys, "engine", "status", *data)
        assert code == 0 and "answering" in out
    finally:
        code, out, _ = run(capsys, "engine", "stop", *data)
    assert code == 0 and "stopped" in out
    code, out, _ = run(capsys, "kv", "stats", "--json", *data)
    assert code == 3 and json.loads(out)["reachable"] is False


def _cli_reads(engine: RunningEngine, monkeypatch: pytest.MonkeyPatch, *, stdin: bytes) -> None:
    """Point the CLI at `engine` and give it `stdin` as its standard input."""
    monkeypatch.setenv("EPISTEMIC_GRAPH_KVCACHE_URL", engine.base_url)
    monkeypatch.setenv("EPISTEMIC_GRAPH_KVCACHE_TOKEN", engine.token.get_secret_value())
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))


def test_put_from_stdin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support.engines import running_engine

    with running_engine(tmp_path, "memory") as engine:
        _cli_reads(engine, monkeypatch, stdin=b"from-stdin")
        code, out, _ = run(capsys, "kv", "put", "stdin:1", "-", "--json")
        assert code == 0 and json.loads(out)["size_bytes"] == len(b"from-stdin")
        assert engine.token.get_secret_value() not in out


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["kv", "get", "a?b"], "rule: charset"),
        (["kv", "get", "stats"], "rule: reserved"),
        (["kv", "exists", "x/exists"], "rule: exists-suffix"),
        (["kv", "stats", "--url", "http://kv.example.com"], "https://"),
        (["kv", "put", "k", "/nonexistent/file"], "does not exist"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_no_traceback(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert needle in err and "Traceback" not in err


def test_unreachable_store_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "kv", "get", "k", "--url", "http://127.0.0.1:9", "--json")
    assert code == 3 and "not reachable" in json.loads(out)["reason"]


def _without_the_engine_package(*argv: str) -> subprocess.CompletedProcess[str]:
    """The CLI run with `argv` in a Python where the engine package cannot be imported."""
    script = (
        "import sys; sys.modules['epistemic_graph_server'] = None\n"
        "from graph_kvcache_mcp.cli import main\n"
        f"raise SystemExit(main({list(argv)!r}))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=60
    )


def test_missing_engine_package_is_named_with_the_install_command(tmp_path: Path) -> None:
    done = _without_the_engine_package("engine", "start", "--data-dir", str(tmp_path))
    assert done.returncode == 3
    assert "pip install 'graph-kvcache-mcp[engine]'" in done.stderr


def test_module_entry_point_matches_the_console_script() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "graph_kvcache_mcp", "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0 and "graph-kvcache-mcp" in done.stdout


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["kv", "put", "k", "/dev/zero"], "more than 67,108,855 bytes"),
        (["diagnose", "miss", "--first", "/dev/zero", "--second", "/dev/zero"], "8,388,608"),
        (["bundle", "compile", "--evidence", "/dev/zero", "--query", "q"], "evidence:"),
        (["diagnose", "budget", "--hf-config", "/tmp/x\0y"], "NUL byte"),
        (["kv", "put", "k", "/tmp/x\0y"], "NUL byte"),
    ],
)
def test_endless_or_impossible_input_exits_2_without_reading_it_all(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert needle in err and "Traceback" not in err


def test_a_huge_sparse_file_is_refused_by_its_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sparse = tmp_path / "sparse"
    with sparse.open("wb") as handle:
        handle.truncate(100 * 1024**3)  # 100 GB, no blocks
    code, _, err = run(capsys, "kv", "put", "k", str(sparse))
    assert code == 2 and "107,374,182,400 bytes" in err


def test_binary_evidence_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    evidence = tmp_path / "evidence.jsonl"
    evidence.write_bytes(b"\xff\xfe\x00\x01binary")
    code, _, err = run(capsys, "bundle", "compile", "--evidence", str(evidence), "--query", "q")
    assert code == 2 and "not UTF-8 text" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({"num_attention_heads": -4}, "num_attention_heads"),
        ({"head_dim": 0}, "head_dim"),
        ({"num_key_value_heads": 64, "num_attention_heads": 4}, "num_key_value_heads"),
    ],
)
def test_a_broken_model_config_exits_2_naming_the_field(
    tmp_path: Path, config: dict[str, object], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.json"
    base = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 256}
    path.write_text(json.dumps({**base, "num_attention_heads": 4, **config}))
    code, _, err = run(capsys, "diagnose", "budget", "--hf-config", str(path))
    assert code == 2 and needle in err and "Traceback" not in err
    deep = tmp_path / "deep.json"
    deep.write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    code, _, err = run(capsys, "diagnose", "budget", "--hf-config", str(deep))
    assert code == 2 and "not readable JSON" in err


def test_engine_start_resp_opens_the_wire_and_status_shows_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("EPISTEMIC_GRAPH_KVCACHE_URL", "EPISTEMIC_GRAPH_KVCACHE_ADDR"):
        monkeypatch.delenv(name, raising=False)
    data = ["--data-dir", str(tmp_path)]
    code, out, _ = run(capsys, "engine", "start", "--backend", "memory", "--resp", "--json", *data)
    try:
        assert code == 0
        address = json.loads(out)["resp_address"]
        assert address.startswith("127.0.0.1:")
        code, out, _ = run(capsys, "engine", "status", *data)
        assert code == 0 and f"resp     {address}" in out
    finally:
        run(capsys, "engine", "stop", *data)


def test_an_empty_value_is_refused_unless_allow_empty_is_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty put would spoil the key for good (the engine keeps the first value)."""
    from tests.support.engines import running_engine

    with running_engine(tmp_path, "memory") as engine:
        _cli_reads(engine, monkeypatch, stdin=b"")
        code, out, err = run(capsys, "kv", "put", "empty:1", "--json")
        assert code == 2 and "--allow-empty" in err and "Traceback" not in err
        refused = json.loads(out)  # --json: the error as one object on stdout too
        assert refused["exit_code"] == 2 and "empty" in refused["error"]
        assert engine.sync_client().contains("empty:1") == Presence(False)
        _cli_reads(engine, monkeypatch, stdin=b"")
        code, out, _ = run(capsys, "kv", "put", "empty:1", "--allow-empty", "--json")
        assert code == 0 and json.loads(out)["size_bytes"] == 0


def test_json_errors_are_one_object_on_stdout_and_the_text_stays_on_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(capsys, "kv", "get", "a?b", "--json")
    refused = json.loads(out)
    assert code == 2 and refused["exit_code"] == 2 and "rule: charset" in refused["error"]
    assert err.startswith("error: ") and "rule: charset" in err


def test_demo_without_the_engine_installed_says_so_and_how_to_install_it(tmp_path: Path) -> None:
    done = _without_the_engine_package("demo", "--data-dir", str(tmp_path))
    assert done.returncode == 3
    assert "not installed" in done.stderr
    assert "pip install 'graph-kvcache-mcp[engine]'" in done.stderr
    assert "stopped by" not in done.stdout + done.stderr
