"""`vllm start` with a node's join flags, refused at the CLI edge (exit 2, the fix in the message)
before anything starts: no edge, no vLLM, no engine in the data dir."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from graph_kvcache_mcp.cli import main
from graph_kvcache_mcp.commands.vllm._start import describe_node
from graph_kvcache_mcp.connectors.files import pki
from graph_kvcache_mcp.domain.edge.node_join import plan_node_join
from graph_kvcache_mcp.domain.edge.pki import HostRequest
from graph_kvcache_mcp.services.node_join import NodeStartOut
from tests.unit.domain.edge.test_node_join import NODE

STORE = ("--engine-url", "https://10.0.0.1:9443", "--store-name", "store")


@pytest.fixture
def node_tls(tmp_path: Path) -> Path:
    now = datetime.now(UTC)
    pki.init_ca(tmp_path / "pki", now=now)
    pki.issue(tmp_path / "pki", HostRequest.of("node-2", ["10.0.0.2"]), tmp_path / "tls", now=now)
    return tmp_path / "tls"


def _refusal(tmp_path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    data_dir = tmp_path / "data"
    args = ["vllm", "start", "--model", "m", "--data-dir", str(data_dir), *flags, "--json"]
    assert main(args) == 2
    assert not data_dir.exists() or not any(data_dir.iterdir())  # nothing started
    error: str = json.loads(capsys.readouterr().out)["error"]
    return error


def test_listen_needs_the_nodes_certificate_and_one_of_its_addresses(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    node_tls: Path,
) -> None:
    monkeypatch.setenv("VLLM_API_KEY", "k")
    assert "add --tls-dir DIR" in _refusal(tmp_path, capsys, "--listen", "10.0.0.2:8443")
    said = _refusal(tmp_path, capsys, "--listen", "10.0.0.9:8443", "--tls-dir", str(node_tls))
    assert "10.0.0.9 is not an address of the node's certificate" in said


def test_a_published_vllm_needs_its_api_key(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    node_tls: Path,
) -> None:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.delenv("NODE_KEY", raising=False)
    flags = ("--listen", "10.0.0.2:8443", "--tls-dir", str(node_tls))
    assert "set VLLM_API_KEY" in _refusal(tmp_path, capsys, *flags)
    assert "set NODE_KEY" in _refusal(tmp_path, capsys, *flags, "--api-key-env", "NODE_KEY")


def test_the_store_token_must_be_a_private_file_of_ours(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], node_tls: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("secret-token-value\n")
    token.chmod(0o644)
    flags = ("--kv-connector", "engine", *STORE, "--tls-dir", str(node_tls))
    said = _refusal(tmp_path, capsys, *flags, "--engine-token-file", str(token))
    assert "open to other users (mode 644)" in said
    assert "secret-token-value" not in said


def test_an_https_store_needs_the_tls_dir_and_the_store_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    said = _refusal(tmp_path, capsys, "--kv-connector", "engine", *STORE[:2])
    assert "needs --tls-dir DIR" in said
    assert "and --store-name NAME" in said


def test_the_text_output_prints_the_fleet_entry_and_the_coordinator_node() -> None:
    plan = plan_node_join(NODE)
    out = NodeStartOut(
        running=True,
        data_dir="/d",
        tools_base_url="http://127.0.0.1:8000/v1",
        fleet_entry=plan.fleet_entry,
        coordinator_node=plan.coordinator_node,
    )
    lines = describe_node(out).splitlines()
    entry = next(line for line in lines if line.startswith("fleet entry"))
    assert json.loads(entry.split(": ", 1)[1])["base_url"] == "https://10.0.0.2:8443/v1"
    assert lines[-1] == "on the store: lmcache coordinator start ... --node node-2@10.0.0.2:8446"
