"""The RESP frames we speak to the engine's Redis wire, and aiming a planned resp adapter at it."""

from __future__ import annotations

import json

import pytest

from graph_kvcache_mcp.domain.engine.resp import resp_command, resp_password, simple_reply
from graph_kvcache_mcp.domain.lmcache.config import (
    LmcacheChoices,
    plan_lmcache,
    point_resp_adapter,
)
from graph_kvcache_mcp.domain.lmcache.model import ModelFacts
from graph_kvcache_mcp.errors import ConfigError

FACTS = ModelFacts(name="m", attention_layers=2, kv_heads=2, head_dim=64)


def test_a_command_is_an_array_of_bulk_strings_counted_in_bytes() -> None:
    assert resp_command("AUTH", "u", "pä") == b"*3\r\n$4\r\nAUTH\r\n$1\r\nu\r\n$3\r\np\xc3\xa4\r\n"


def test_one_line_replies_split_into_ok_error_and_unexpected() -> None:
    assert simple_reply(b"+PONG\r\n") == (True, "PONG")
    assert simple_reply(b"-WRONGPASS invalid\r\n") == (False, "WRONGPASS invalid")
    assert simple_reply(b"") == (False, "no reply")
    assert simple_reply(b"$3\r\n")[0] is False


def test_the_password_depends_on_user_and_secret_and_is_hex() -> None:
    one = resp_password("secret", "lmcache")
    assert len(one) == 64 and int(one, 16) >= 0
    assert one != resp_password("secret", "other") != resp_password("other", "lmcache")


def test_the_planned_resp_adapter_is_aimed_at_the_engines_wire_and_nothing_else_changes() -> None:
    plan = plan_lmcache(FACTS, LmcacheChoices(mode="redis_resp"))
    assert plan.lmcache_server is not None
    aimed = point_resp_adapter(plan.lmcache_server, "127.0.0.1", 40123)
    adapter = json.loads(aimed.argv[aimed.argv.index("--l2-adapter") + 1])
    assert (adapter["type"], adapter["host"], adapter["port"]) == ("resp", "127.0.0.1", 40123)
    assert "password" not in adapter
    assert len(aimed.argv) == len(plan.lmcache_server.argv) and aimed.env == plan.lmcache_server.env
    native = plan_lmcache(FACTS, LmcacheChoices(mode="mp_native")).lmcache_server
    assert native is not None
    with pytest.raises(ConfigError, match="no resp L2 adapter"):
        point_resp_adapter(native, "127.0.0.1", 40123)
