"""The stdio transport answers what it cannot read: raw bytes over a real `graph-kvcache-mcp`
process, each malformed line answered with its JSON-RPC error (and its id where one can be
read) and logged, while the session keeps serving."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.stdio_raw import INITIALIZE, RawStdio, raw_stdio

START_S = 60.0  # a cold start under load (imports, a loaded 2-core machine)
ANSWER_S = 5.0  # "at once": a client would otherwise wait for its own 20-60 s timeout

PING = b'{"jsonrpc":"2.0","id":"after","method":"ping"}'

# (raw line, code, ids answered): bytes no JSON encoder produces included.
MALFORMED: dict[str, tuple[bytes, int, list[Any]]] = {
    "not JSON": (b"this is not json", -32700, [None]),
    "cut JSON": (b'{"jsonrpc":"2.0","id":7,"method":"ping"', -32700, [None]),
    "lone surrogate": (
        b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"kv_get",'
        b'"arguments":{"keys":["caf\xc3\xa9 \\ud83d"]}}}',
        -32700,
        [3],
    ),
    "batch": (
        b'[{"jsonrpc":"2.0","id":11,"method":"ping"},{"jsonrpc":"2.0","id":"b","method":"ping"}]',
        -32600,
        [11, "b"],
    ),
    "empty batch": (b"[]", -32600, [None]),
    "params as a string": (b'{"jsonrpc":"2.0","id":4,"method":"ping","params":"str"}', -32600, [4]),
    "id without method": (b'{"jsonrpc":"2.0","id":5}', -32600, [5]),
    "wrong jsonrpc": (b'{"jsonrpc":"1.0","id":6,"method":"ping"}', -32600, [6]),
    "a bare number": (b"42", -32600, [None]),
}


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RawStdio]:
    with raw_stdio(tmp_path_factory.mktemp("stdio-raw"), "--toolsets", "kv,engine") as server:
        answer = server.ask(INITIALIZE, within_s=START_S)
        assert answer["id"] == "init" and "result" in answer
        server.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
        yield server


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_line_is_answered_at_once_with_its_id_and_the_session_keeps_serving(
    session: RawStdio, case: str
) -> None:
    line, code, ids = MALFORMED[case]
    session.send(line)
    answers = session.answers(len(ids), within_s=ANSWER_S)
    assert [answer["id"] for answer in answers] == ids
    assert {answer["error"]["code"] for answer in answers} == {code}
    assert all(answer["error"]["message"] for answer in answers)
    after = session.ask(PING, within_s=ANSWER_S)
    assert after == {"jsonrpc": "2.0", "id": "after", "result": {}}


def test_every_refused_line_leaves_one_log_line_naming_the_code(session: RawStdio) -> None:
    session.send(MALFORMED["params as a string"][0])
    session.answers(1, within_s=ANSWER_S)
    session.ask(PING, within_s=ANSWER_S)  # the log line is written before the answer
    refused = [line for line in session.log().splitlines() if "refused a malformed message" in line]
    assert refused and "(-32600, id 4)" in refused[-1]
    assert "params must be an object" in refused[-1]


def test_the_lone_surrogate_answer_says_the_text_was_cut_inside_a_character(
    session: RawStdio,
) -> None:
    answer = session.ask(MALFORMED["lone surrogate"][0], within_s=ANSWER_S)
    assert "surrogate" in answer["error"]["message"]
    assert answer["id"] == 3


WRONG_TYPES = {
    "samples true": ("kv_probe", {"samples": True}, "samples: should be a valid integer"),
    'samples "5"': ("kv_probe", {"samples": "5"}, "samples: should be a valid integer"),
    'include_value "yes"': (
        "kv_get",
        {"keys": ["k"], "include_value": "yes"},
        "include_value: should be a valid boolean",
    ),
    'force "false"': ("engine_stop", {"force": "false"}, "force: should be a valid boolean"),
}


@pytest.mark.parametrize("case", sorted(WRONG_TYPES))
def test_a_wrong_json_type_is_refused_by_name_never_coerced(session: RawStdio, case: str) -> None:
    tool, arguments, wanted = WRONG_TYPES[case]
    call = {
        "jsonrpc": "2.0",
        "id": case,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }
    answer = session.ask(call, within_s=START_S)
    assert answer["id"] == case and answer["result"]["isError"] is True
    text = answer["result"]["content"][0]["text"]
    assert wanted in text and "(got a " in text


def test_a_call_before_initialize_says_to_initialize_first(tmp_path: Path) -> None:
    with raw_stdio(tmp_path, "--toolsets", "kv") as fresh:
        call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "kv_stats"}}
        early = fresh.ask(call, within_s=START_S)
        ping = fresh.ask(PING, within_s=ANSWER_S)  # ping needs no handshake
        assert fresh.ask(INITIALIZE, within_s=ANSWER_S)["id"] == "init"
    assert early["id"] == 1 and early["error"]["code"] == -32600
    assert early["error"]["message"].startswith("initialize first")
    assert ping["result"] == {}


def test_a_second_initialize_on_the_session_is_refused(session: RawStdio) -> None:
    again = session.ask({**INITIALIZE, "id": "again"}, within_s=ANSWER_S)
    assert again["id"] == "again" and again["error"]["code"] == -32600
    assert "already initialized" in again["error"]["message"]
    assert session.ask(PING, within_s=ANSWER_S)["result"] == {}


BAD_PARAMS = {
    "tools/call without a name": (
        {"method": "tools/call", "params": {"arguments": {}}},
        "params.name: required field missing",
    ),
    "arguments as a string": (
        {"method": "tools/call", "params": {"name": "kv_stats", "arguments": "x"}},
        "arguments: should be a valid dictionary (got a string)",
    ),
    "resources/read without a uri": (
        {"method": "resources/read", "params": {}},
        "uri: required field missing",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_PARAMS))
def test_params_that_do_not_fit_the_method_are_32602_naming_the_field(
    session: RawStdio, case: str
) -> None:
    request, wanted = BAD_PARAMS[case]
    answer = session.ask({"jsonrpc": "2.0", "id": case, **request}, within_s=ANSWER_S)
    assert answer["id"] == case and answer["error"]["code"] == -32602
    assert wanted in answer["error"]["message"]


def test_a_client_that_vanishes_mid_call_ends_the_server_quietly(tmp_path: Path) -> None:
    with raw_stdio(tmp_path, "--toolsets", "kv") as fresh:
        fresh.ask(INITIALIZE, within_s=START_S)
        fresh.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
        call = {"name": "kv_probe", "arguments": {"samples": 20}}
        fresh.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call})
        assert fresh.process.stdout is not None and fresh.process.stdin is not None
        fresh.process.stdout.close()  # the client is gone: its answer has nowhere to go
        assert fresh.process.wait(timeout=START_S) == 0
        log = fresh.log()
    assert "Traceback" not in log
    assert [line for line in log.splitlines() if line.strip()] == [
        "WARNING graph_kvcache_mcp.host.stdio: the client closed its end of stdout; shutting down"
    ]
    assert not (tmp_path / "engine" / "engine.sock").exists()
