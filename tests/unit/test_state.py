"""`since` ids: each carries its snapshot, signed, so the server keeps nothing and an id works for
as long as the data dir's key, whatever other sessions do meanwhile."""

from __future__ import annotations

import base64
import string
from typing import Any

import pytest

from graph_kvcache_mcp.domain.snapshot_ids import MAX_ID_CHARS, SnapshotIdError, seal, unseal
from graph_kvcache_mcp.state import Snapshots

KEY, OTHER_KEY = b"k" * 32, b"o" * 32


def snapshots(key: bytes = KEY, kind: str = "kv") -> Snapshots[dict[str, Any]]:
    return Snapshots(kind, lambda: key, lambda s: s, dict)


def test_an_id_carries_its_snapshot_however_many_are_handed_out_after_it() -> None:
    store = snapshots()
    first = store.keep({"hits": 1})
    later = [store.keep({"hits": n}) for n in range(200)]
    assert first is not None and first.startswith("kv-") and len(set(later)) == 200
    assert store.find(first, "kv_stats") == {"hits": 1}
    # Another server of the same data dir (same key), e.g. after a restart, reads it too.
    assert snapshots().find(first, "kv_stats") == {"hits": 1}


def test_an_altered_or_foreign_id_is_refused_naming_the_fix() -> None:
    snapshot_id = snapshots().keep({"hits": 1})
    assert snapshot_id is not None
    body, mac = snapshot_id.rsplit(".", 1)
    forged = seal("kv", b'{"hits":999}', OTHER_KEY).rsplit(".", 1)[0] + "." + mac
    for bad in (forged, body + "." + ("A" if mac[0] != "A" else "B") + mac[1:]):
        with pytest.raises(SnapshotIdError, match="signature does not match"):
            snapshots().find(bad, "kv_stats")
    with pytest.raises(SnapshotIdError, match="another data dir"):
        snapshots(OTHER_KEY).find(snapshot_id, "kv_stats")
    with pytest.raises(SnapshotIdError, match="not a snapshot this server holds"):
        snapshots().find("kv-00000000", "kv_stats")


def test_an_id_of_another_tool_is_refused_by_name() -> None:
    vllm_id = snapshots(kind="vllm").keep({"prompt_tokens": 5})
    assert vllm_id is not None
    with pytest.raises(SnapshotIdError, match="names a 'vllm' snapshot, not one of kv_stats"):
        snapshots().find(vllm_id, "kv_stats")


def test_ids_are_bounded_before_anything_is_inflated() -> None:
    with pytest.raises(SnapshotIdError, match=f"longer than any snapshot id \\({MAX_ID_CHARS}\\)"):
        unseal("kv", "kv-" + "A" * MAX_ID_CHARS, KEY, tool="kv_stats")
    # A signed bomb (a key leaked) still inflates no further than the bound.
    bomb = seal("kv", b"0" * 200_000, KEY)
    assert len(unseal("kv", bomb, KEY, tool="kv_stats")) == 200_000
    with pytest.raises(SnapshotIdError, match="too large"):
        seal("kv", b"0" * 300_000, KEY)


def test_a_snapshot_too_large_for_an_id_gets_none_not_an_error() -> None:
    store: Snapshots[str] = Snapshots("kv", lambda: KEY, lambda s: s, str)
    assert store.keep("x" * 300_000) is None


def test_an_id_has_one_spelling_other_base64_of_the_same_bytes_is_refused() -> None:
    snapshot_id = snapshots().keep({"hits": 1})
    assert snapshot_id is not None
    body, mac = snapshot_id.rsplit(".", 1)
    alphabet = string.ascii_uppercase + string.ascii_lowercase + string.digits + "-_"
    # The last character's low bits carry nothing (16 bytes in 22 characters): another value
    # there decodes to the same MAC; so does a stray character the decoder would skip.
    other_bits = mac[:-1] + alphabet[alphabet.index(mac[-1]) ^ 1]
    for spelling in (other_bits, mac[:5] + "!" + mac[5:]):
        assert base64.urlsafe_b64decode(spelling + "==") == base64.urlsafe_b64decode(mac + "==")
        with pytest.raises(SnapshotIdError, match="signature does not match"):
            snapshots().find(body + "." + spelling, "kv_stats")
