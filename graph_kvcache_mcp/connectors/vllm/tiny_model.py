"""Build a tiny Llama that vLLM can serve on a CPU, from nothing that needs a network.

Run it with the vLLM venv's interpreter (it needs torch, transformers and tokenizers; the
package is installed there without its dependencies):

    .venv-vllm/bin/python -m graph_kvcache_mcp.connectors.vllm.tiny_model OUT_DIR
        [--layers N --hidden H --kv-heads K]

(the size flags build a larger model for benchmarks whose prefill must dominate, e.g.
`tools/bench_connector.py`; heads are always 64 wide).

It trains a byte-level BPE tokenizer on local text (this interpreter's standard-library sources),
gives it a chat template, and saves a 2-layer `LlamaForCausalLM` with random weights (hidden 128,
2 heads of 64 — a head size vLLM's CPU attention accepts) as bf16 safetensors. The answers are
gibberish; the model exists so that prefix caching, metrics and the server lifecycle are real.
The output is written to a scratch sibling and renamed, so a half-built dir is never used.
The tests (tests/support/vllm.py) and `graph-kvcache-mcp demo --vllm` build their model with it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

VOCAB_SIZE = 4096
SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|system|>", "<|user|>", "<|assistant|>"]
# Each turn is "<|role|>\n{content}<|eos|>\n"; generation starts after "<|assistant|>\n".
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|eos|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
TRAINING_FILES = 120  # enough stdlib text for a 4k vocabulary in a few seconds


def training_texts() -> list[str]:
    """Standard-library sources, in a fixed order, so every machine trains on the same text."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(stdlib.glob("*.py"))[:TRAINING_FILES]
    return [path.read_text(encoding="utf-8", errors="replace") for path in files]


def build_tokenizer(out_dir: Path) -> int:
    """Train and save the tokenizer; returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_texts(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        pad_token="<|pad|>",
        model_max_length=4096,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    return int(tokenizer.get_vocab_size())


@dataclass(frozen=True)
class Size:
    layers: int = 2
    hidden: int = 128
    kv_heads: int = 2


def build_model(out_dir: Path, vocab_size: int, size: Size) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=size.hidden,
        intermediate_size=2 * size.hidden,
        num_hidden_layers=size.layers,
        num_attention_heads=size.hidden // 64,
        num_key_value_heads=size.kv_heads,
        head_dim=64,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out_dir, safe_serialization=True)


BUILD_TIMEOUT_S = 300.0


def build_tiny_model(python: Path, out_dir: Path, *size_flags: str) -> Path:
    """Build the model into `out_dir` with `python` (the vLLM venv's, which has torch and
    transformers), unless it is there already; returns `out_dir`.

    Raises:
        subprocess.CalledProcessError: the build failed (its stderr went to ours).
    """
    if not (out_dir / "config.json").exists():
        command = [str(python), "-m", __spec__.name if __spec__ else __name__, str(out_dir)]
        subprocess.run([*command, *size_flags], check=True, timeout=BUILD_TIMEOUT_S)
    return out_dir


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="build a tiny random Llama for vLLM on CPU")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--layers", type=int, default=Size.layers)
    parser.add_argument("--hidden", type=int, default=Size.hidden)
    parser.add_argument("--kv-heads", type=int, default=Size.kv_heads)
    args = parser.parse_args(argv)
    size = Size(args.layers, args.hidden, args.kv_heads)
    out_dir = args.out_dir.resolve()
    if (out_dir / "config.json").exists():
        return 0
    # A per-process scratch dir: two test runs building at once must not share one.
    work = out_dir.with_name(f"{out_dir.name}.partial-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    vocab_size = build_tokenizer(work)
    build_model(work, vocab_size, size)
    try:
        work.rename(out_dir)
    except OSError:
        if not (out_dir / "config.json").exists():
            raise
        shutil.rmtree(work, ignore_errors=True)  # another run finished first; theirs is the same
    print(f"tiny model ready in {out_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
