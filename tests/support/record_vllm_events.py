"""Record KV event batches with a vLLM wheel's own encoder, for the decoder's unit tests.

    .venv-vllm/bin/python -m tests.support.record_vllm_events KV_EVENTS_PY OUT

KV_EVENTS_PY is `vllm/distributed/kv_events.py` from the wheel to record (unzip it from
`pip download --no-deps vllm==X`); it loads beside the installed vLLM, whose helpers it imports.
OUT receives one msgpack payload per batch of the scenario, each prefixed by its length (4 bytes,
big-endian): the bytes vLLM's publisher sends after its topic frame.

The scenario (block size 4, lookahead 2 where the wheel hashes ahead): an attention instance
stores prompt A's two hashable blocks, then prompt B that shares A's first block's tokens but
not the two after it, then removes A's first block; an MLA instance stores A's blocks.
"""

from __future__ import annotations

import importlib.util
import struct
import sys
from functools import partial
from pathlib import Path
from typing import Any

BLOCK = 4
AHEAD = 2
PROMPT_A = list(range(100, 113))
PROMPT_B = [*PROMPT_A[:5], 999, 998, 997, 996, 995]


def _ahead(tokens: list[int], blocks: int) -> list[list[int]]:
    return [tokens[(i + 1) * BLOCK : (i + 1) * BLOCK + AHEAD] for i in range(blocks)]


def _scenario(events: Any) -> list[Any]:
    removed, batch = events.BlockRemoved, events.KVEventBatch
    # Every stored block of the scenario starts a prompt of its own, in group 0 on the GPU.
    stored = partial(
        events.BlockStored,
        parent_block_hash=None,
        block_size=BLOCK,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        group_idx=0,
    )
    a = stored(
        block_hashes=[11, 12],
        token_ids=PROMPT_A[:8],
        kv_cache_spec_kind="full_attention",
        lookahead_token_ids=_ahead(PROMPT_A, 2),
    )
    b = stored(
        block_hashes=[21],
        token_ids=PROMPT_B[:4],
        kv_cache_spec_kind="full_attention",
        lookahead_token_ids=_ahead(PROMPT_B, 1),
    )
    mla = stored(
        block_hashes=[31, 32, 33], token_ids=PROMPT_A[:12], kv_cache_spec_kind="mla_attention"
    )
    return [
        batch(ts=1.0, events=[a, b]),
        batch(ts=2.0, events=[removed(block_hashes=[11], medium="GPU", group_idx=0)]),
        batch(ts=3.0, events=[mla]),
    ]


def main(source: str, out: str) -> None:
    spec = importlib.util.spec_from_file_location("recorded_kv_events", source)
    assert spec is not None and spec.loader is not None
    events = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(events)
    import msgspec  # type: ignore[import-not-found]  # vLLM's venv has it; ours need not

    encoder = msgspec.msgpack.Encoder()
    with Path(out).open("wb") as sink:
        for batch in _scenario(events):
            payload = encoder.encode(batch)
            sink.write(struct.pack(">I", len(payload)) + payload)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
