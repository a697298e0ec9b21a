"""The worker side of `EngineKVConnector` for hybrid models (Mamba2 + attention, align mode).

What a hybrid adds to the dense path: its layers sit in several KV cache groups that overlay one
allocation (`raw_pages`), a block's value holds the attention layers' pages only, and the
recurrent state at a boundary is one more value holding every Mamba layer's page (all Mamba
groups, group by group), under its own key and identity (`domain.vllm.hybrid.kv_plan`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from graph_kvcache_mcp.domain.vllm.hybrid.kv_plan import HybridLoad, StateTransfer
from graph_kvcache_mcp.domain.vllm.kv_blocks import KvModelIdentity
from graph_kvcache_mcp.domain.vllm.kv_plan import BlockTransfer
from graph_kvcache_mcp.plugins.vllm_kv.raw_pages import Placement, RawPages
from graph_kvcache_mcp.plugins.vllm_kv.receive import BlockLoader, fetch_runs
from graph_kvcache_mcp.plugins.vllm_kv.store import EngineBlockStore

if TYPE_CHECKING:
    from vllm.v1.kv_cache_interface import KVCacheConfig

ATTENTION_KIND = "FullAttentionSpec"
STATE_KIND = "MambaSpec"


@dataclass(frozen=True)
class HybridLayout:
    """Which groups and layers hold what, and where their pages are."""

    attention_group: int
    state_groups: tuple[int, ...]
    attention_layers: tuple[str, ...]
    state_layers: tuple[tuple[str, ...], ...]
    """Each Mamba group's layers, in group order."""
    placements: Mapping[str, Placement]
    num_blocks: int
    description: str
    """Every group's kind, layer count and page geometry: part of the model identity."""
    state_page_bytes: int

    @property
    def flat_state_layers(self) -> tuple[str, ...]:
        return tuple(name for layers in self.state_layers for name in layers)


def hybrid_layout(kv_cache_config: KVCacheConfig) -> HybridLayout:
    """Read a hybrid's groups and page placements from vLLM's KV cache config (checked before by
    `kv_blocks.unsupported_hybrid`: one full-attention group, the rest Mamba groups)."""
    groups = kv_cache_config.kv_cache_groups
    kinds = [type(group.kv_cache_spec).__name__ for group in groups]
    attention = kinds.index(ATTENTION_KIND)
    states = tuple(index for index, kind in enumerate(kinds) if kind == STATE_KIND)
    page_of = {
        name: int(group.kv_cache_spec.page_size_bytes)
        for group in groups
        for name in group.layer_names
    }
    placements: dict[str, Placement] = {}
    for tensor in kv_cache_config.kv_cache_tensors:
        for position, name in enumerate(tensor.layers):
            if name in page_of:
                offset = tensor.offset + position * tensor.layer_stride
                placements[name] = Placement(offset, tensor.block_stride, page_of[name])
    described = [_describe(kind, group) for kind, group in zip(kinds, groups, strict=True)]
    state_spec: Any = groups[states[0]].kv_cache_spec
    return HybridLayout(
        attention_group=attention,
        state_groups=states,
        attention_layers=tuple(sorted(groups[attention].layer_names)),
        state_layers=tuple(tuple(sorted(groups[index].layer_names)) for index in states),
        placements=placements,
        num_blocks=int(kv_cache_config.num_blocks),
        description=json.dumps(described, sort_keys=True, separators=(",", ":")),
        state_page_bytes=int(state_spec.page_size_bytes),
    )


def state_identity(identity: KvModelIdentity, layout: HybridLayout) -> KvModelIdentity:
    """The identity a state value is checked against: the Mamba layers' pages, not attention's."""
    return identity.model_copy(
        update={
            "num_layers": len(layout.flat_state_layers),
            "page_bytes": layout.state_page_bytes,
            "layout": f"{identity.layout}:mamba-state",
        }
    )


class HybridPages:
    """One worker's hybrid KV cache: attention blocks and Mamba states, loaded and copied out."""

    def __init__(
        self,
        caches: Mapping[str, Any],
        layout: HybridLayout,
        store: EngineBlockStore,
        identity: KvModelIdentity,
        states: KvModelIdentity,
    ) -> None:
        if missing := sorted(set(caches) - set(layout.placements)):
            raise ValueError(
                "EngineKVConnector: vLLM registered KV cache layers that its KV cache config "
                f"does not place: {', '.join(missing)}"
            )
        self.layout = layout
        self.pages = RawPages(caches, layout.placements, layout.num_blocks)
        self.store = store
        self.blocks = BlockLoader(store, identity, self._write_block, self._block_pages)
        self.states = BlockLoader(store, states, self._write_state)  # one value, many blocks
        self._state_targets: list[tuple[tuple[int, ...], ...]] = []

    def load(self, load: HybridLoad) -> tuple[int, int, str | None]:
        """Load all of a request's blocks and its state: (blocks loaded, bytes read, why not).

        All or nothing: vLLM recomputes a failed hybrid request from its start. The state is
        fetched in the same batch as the blocks.
        """
        self._state_targets = [load.state.block_ids]
        return load_all(self.store, self.blocks, self.states, load)

    def copy_blocks(self, saves: Sequence[BlockTransfer]) -> list[tuple[str, bytes]]:
        """(key, attention pages) of every block to save, copied out of the cache now."""
        attention = self.layout.attention_layers
        return [
            (key, self.pages.read(attention, [block_id] * len(attention)))
            for save in saves
            for key, block_id in zip(save.keys, save.block_ids, strict=True)
        ]

    def copy_states(self, states: Sequence[StateTransfer]) -> list[tuple[str, bytes]]:
        """(key, every Mamba layer's page) of every state to save, copied out now."""
        items = []
        for state in states:
            ids = [blocks[0] for blocks in per_state_layer(self.layout, state.block_ids)]
            items.append((state.key, self.pages.read(self.layout.flat_state_layers, ids)))
        return items

    def _block_pages(self, block_id: int) -> list[memoryview]:
        return self.pages.views(self.layout.attention_layers, block_id)

    def _write_block(self, block_id: int, payload: memoryview) -> None:
        attention = self.layout.attention_layers
        self.pages.write(attention, [(block_id,)] * len(attention), payload)

    def _write_state(self, index: int, payload: memoryview) -> None:
        per_layer = per_state_layer(self.layout, self._state_targets[index])
        self.pages.write(self.layout.flat_state_layers, per_layer, payload)


def per_state_layer(
    layout: HybridLayout, group_blocks: Sequence[tuple[int, ...]]
) -> list[tuple[int, ...]]:
    """Each Mamba group's blocks of a state, repeated for each of the group's layers, in
    `flat_state_layers` order (the order a state value holds their pages)."""
    return [
        blocks
        for layers, blocks in zip(layout.state_layers, group_blocks, strict=True)
        for _ in layers
    ]


def load_all(
    store: EngineBlockStore, blocks: BlockLoader, states: BlockLoader, load: HybridLoad
) -> tuple[int, int, str | None]:
    """Fetch a request's blocks and its state in one batch: (values loaded, bytes, why not).

    The state loader's `write_block` is called with index 0 for `load.state`.
    """
    got, state = fetch_runs(
        store,
        [
            (blocks, load.blocks.keys, load.blocks.block_ids),
            (states, [load.state.key], [0]),
        ],
    )
    if got.failure is not None:
        return got.loaded_blocks, got.read_bytes, f"block {got.failure[0]}: {got.failure[1]}"
    if state.failure is not None:
        why = f"state {state.failure[0]}: {state.failure[1]}"
        return got.loaded_blocks, got.read_bytes, why
    return got.loaded_blocks + 1, got.read_bytes + state.read_bytes, None


def _describe(kind: str, group: Any) -> dict[str, Any]:
    spec = group.kv_cache_spec
    described: dict[str, Any] = {
        "kind": kind,
        "layers": len(group.layer_names),
        "block": int(spec.block_size),
        "page": int(spec.page_size_bytes),
    }
    if kind == STATE_KIND:
        described["shapes"] = [list(shape) for shape in spec.shapes]
        described["dtypes"] = [str(dtype).removeprefix("torch.") for dtype in spec.dtypes]
        described["mode"] = str(spec.mamba_cache_mode)
        described["mamba"] = str(getattr(spec.mamba_type, "value", spec.mamba_type))
    return described
