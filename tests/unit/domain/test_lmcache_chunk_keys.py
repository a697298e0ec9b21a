"""Offline chunk keys equal LMCache's own: its TokenHasher and its native_plugin key string
(run in .venv-lmcache), and the engine key `lmcache key` prints."""

from __future__ import annotations

import json
import subprocess

import pytest

from graph_kvcache_mcp.cli import main
from graph_kvcache_mcp.domain.lmcache.chunk_keys import (
    ChunkScheme,
    KeysUnknown,
    leading_tokens,
    prompt_chunk_keys,
)
from graph_kvcache_mcp.domain.lmcache.keys import engine_key
from tests.support.lmcache import require_lmcache

MODEL = "/models/tiny-llama"
TOKENS = [(i * 7919) % 32000 for i in range(700)]  # two whole chunks of 256 and a partial one

LMCACHE_KEYS = """
import json, sys
from lmcache.v1.distributed.api import ObjectKey
from lmcache.v1.distributed.l2_adapters.native_connector_l2_adapter import _object_key_to_string
from lmcache.v1.multiprocess.token_hasher import TokenHasher
args = json.loads(sys.argv[1])
hasher = TokenHasher(chunk_size=args["chunk"], hash_algorithm="blake3")
keys = [
    _object_key_to_string(ObjectKey(h, args["model"], 0x01000100, 0, args["salt"]))
    for h in hasher.compute_chunk_hashes(args["tokens"])
]
print(json.dumps(keys))
"""


def lmcache_keys(tokens: list[int], *, chunk: int, salt: str = "") -> list[str]:
    python = require_lmcache().parent / "python"
    args = json.dumps({"tokens": tokens, "chunk": chunk, "model": MODEL, "salt": salt})
    done = subprocess.run(
        [str(python), "-c", LMCACHE_KEYS, args],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={"LMCACHE_DISABLE_BANNER": "1", "LMCACHE_TRACK_USAGE": "false"},
    )
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize(("chunk", "salt"), [(256, ""), (64, "tenant-a")])
def test_the_keys_equal_lmcaches_own_for_every_whole_chunk(chunk: int, salt: str) -> None:
    keys = prompt_chunk_keys(TOKENS, ChunkScheme(model=MODEL, chunk_size=chunk, cache_salt=salt))
    assert not isinstance(keys, KeysUnknown)
    assert [k.lmcache_key for k in keys] == lmcache_keys(TOKENS, chunk=chunk, salt=salt)
    assert [k.end_token for k in keys] == [chunk * (i + 1) for i in range(len(TOKENS) // chunk)]
    assert [k.engine_key for k in keys] == [engine_key(k.lmcache_key) for k in keys]


def test_the_engine_key_is_what_the_lmcache_key_command_prints(
    capsys: pytest.CaptureFixture[str],
) -> None:
    keys = prompt_chunk_keys(TOKENS, ChunkScheme(model=MODEL))
    assert not isinstance(keys, KeysUnknown)
    assert main(["lmcache", "key", keys[1].lmcache_key]) == 0
    assert keys[1].engine_key in capsys.readouterr().out


def test_a_namespace_changes_every_engine_key_but_no_lmcache_key() -> None:
    plain = prompt_chunk_keys(TOKENS, ChunkScheme(model=MODEL))
    spaced = prompt_chunk_keys(TOKENS, ChunkScheme(model=MODEL, namespace="fleet-b"))
    assert not isinstance(plain, KeysUnknown) and not isinstance(spaced, KeysUnknown)
    assert [k.lmcache_key for k in plain] == [k.lmcache_key for k in spaced]
    assert not {k.engine_key for k in plain} & {k.engine_key for k in spaced}


def test_a_prompt_shorter_than_a_chunk_has_no_keys() -> None:
    assert prompt_chunk_keys(TOKENS[:255], ChunkScheme(model=MODEL)) == []


@pytest.mark.parametrize("algorithm", ["sha256_cbor", "builtin"])
def test_seeded_hashes_are_unknown_with_the_reason(algorithm: str) -> None:
    keys = prompt_chunk_keys(TOKENS, ChunkScheme(model=MODEL, hash_algorithm=algorithm))
    assert isinstance(keys, KeysUnknown)
    assert algorithm in keys.reason and "PYTHONHASHSEED" in keys.reason


def test_only_the_leading_run_of_present_chunks_counts() -> None:
    keys = prompt_chunk_keys(TOKENS, ChunkScheme(model=MODEL, chunk_size=64))
    assert not isinstance(keys, KeysUnknown)
    present = [True, True, False] + [True] * (len(keys) - 3)
    assert leading_tokens(keys, present) == 128
    assert leading_tokens(keys, [False] * len(keys)) == 0
    assert leading_tokens(keys, [True] * len(keys)) == 64 * len(keys)


@pytest.mark.parametrize(
    ("field", "value"), [("model", "a@b"), ("chunk_size", 0), ("cache_salt", "x@y")]
)
def test_a_scheme_that_cannot_name_a_chunk_is_refused(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field.split("_")[-1]):
        ChunkScheme(**{"model": MODEL, field: value})  # type: ignore[arg-type]


def test_a_token_id_lmcache_cannot_pack_is_refused() -> None:
    with pytest.raises(ValueError, match="token ids"):
        prompt_chunk_keys([-1] * 256, ChunkScheme(model=MODEL))
