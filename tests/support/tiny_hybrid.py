"""Build tiny random Mamba2 hybrids that CPU vLLM serves, from nothing that needs a network.

Run it with the vLLM venv's interpreter (torch, transformers and tokenizers live there):

    .venv-vllm/bin/python tests/support/tiny_hybrid.py OUT_DIR --family granite|nemotron

- `granite`: GraniteMoeHybrid, layers mamba, attention, mamba, attention: two KV cache groups in
  vLLM (one mamba, one attention).
- `nemotron`: NemotronH, four mamba layers and two attention layers: vLLM splits the mamba layers
  into two groups of two, so three KV cache groups (mamba, mamba, attention).

Both use the tiny Llama's tokenizer and chat template (`fixtures/tiny_model.py`), 64-wide
attention heads (a size CPU attention accepts) and a Mamba2 mixer of 4 heads of 32 with a
16-wide state. `mamba_chunk_size` is 64: smaller than the block vLLM picks for these models on
CPU, so the recipe's chunk override (`--hf-overrides`) is exercised (../shared hybrid-cpu facts).
Random weights: the answers are gibberish; caching, events and logprobs are real.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from graph_kvcache_mcp.fixtures.tiny_model import build_tokenizer

FAMILIES = ("granite", "nemotron")
HIDDEN = 128
MAMBA = {"heads": 4, "head_dim": 32, "state": 16, "groups": 1, "conv": 4, "chunk": 64}


def _common(vocab_size: int) -> dict[str, Any]:
    return {
        "vocab_size": vocab_size,
        "hidden_size": HIDDEN,
        "intermediate_size": 2 * HIDDEN,
        "num_attention_heads": HIDDEN // 64,
        "num_key_value_heads": 2,
        "max_position_embeddings": 8192,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
    }


def granite_config(vocab_size: int) -> Any:
    from transformers import GraniteMoeHybridConfig

    return GraniteMoeHybridConfig(
        **_common(vocab_size),
        num_hidden_layers=4,
        layer_types=["mamba", "attention", "mamba", "attention"],
        num_local_experts=0,
        shared_intermediate_size=2 * HIDDEN,
        position_embedding_type="rope",
        mamba_n_heads=MAMBA["heads"],
        mamba_d_head=MAMBA["head_dim"],
        mamba_d_state=MAMBA["state"],
        mamba_n_groups=MAMBA["groups"],
        mamba_d_conv=MAMBA["conv"],
        mamba_expand=1,
        mamba_chunk_size=MAMBA["chunk"],
    )


def nemotron_config(vocab_size: int) -> Any:
    from transformers import NemotronHConfig

    return NemotronHConfig(
        **_common(vocab_size),
        head_dim=64,
        layers_block_type=["mamba", "attention", "mamba", "mamba", "attention", "mamba"],
        mamba_num_heads=MAMBA["heads"],
        mamba_head_dim=MAMBA["head_dim"],
        ssm_state_size=MAMBA["state"],
        n_groups=MAMBA["groups"],
        conv_kernel=MAMBA["conv"],
        expand=1,
        chunk_size=MAMBA["chunk"],
    )


def build(out_dir: Path, family: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    out_dir = out_dir.resolve()
    if (out_dir / "config.json").exists():
        return
    work = out_dir.with_name(f"{out_dir.name}.partial-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    vocab_size = build_tokenizer(work)
    config = (granite_config if family == "granite" else nemotron_config)(vocab_size)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    model.save_pretrained(work, safe_serialization=True)
    try:
        work.rename(out_dir)
    except OSError:
        if not (out_dir / "config.json").exists():
            raise
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="build a tiny random Mamba2 hybrid for CPU vLLM")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--family", choices=FAMILIES, required=True)
    args = parser.parse_args(argv)
    build(args.out_dir, args.family)
    print(f"tiny {args.family} hybrid ready in {args.out_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
