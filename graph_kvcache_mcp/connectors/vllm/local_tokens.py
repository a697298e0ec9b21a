"""Token ids of a chat request from a local Hugging Face tokenizer dir, for `diagnose miss` when no
vLLM runs: `tokenizer.json`, and the chat template from `chat_template.jinja` or
`tokenizer_config.json`, rendered the way vLLM does for a chat completion (generation prompt on,
no special tokens added beyond the template's own).

Needs the optional `tokenizers` and `jinja2` packages (the `tokenizer` extra), imported on first
use. Local files only: nothing is downloaded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Self

from graph_kvcache_mcp.connectors.vllm.routes import ChatTokens
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.errors import ConfigError

MAX_FILE_BYTES = 64 * 1024 * 1024


class LocalChatTokenizer:
    """A tokenizer dir's chat tokenization; the same calls as `VllmRoutes` (model is ignored)."""

    def __init__(self, directory: str | Path) -> None:
        """Load the dir's tokenizer and chat template.

        Raises:
            ConfigError: no tokenizer.json or chat template there, or the packages are missing.
        """
        self.directory = Path(directory).expanduser()
        self.name = f"local:{self.directory.name}"
        try:
            from jinja2 import TemplateError
            from jinja2.ext import loopcontrols
            from jinja2.sandbox import ImmutableSandboxedEnvironment
            from tokenizers import Tokenizer
        except ImportError:
            raise ConfigError(
                "--tokenizer needs the tokenizers and jinja2 packages: "
                "pip install 'graph-kvcache-mcp[tokenizer]'"
            ) from None
        tokenizer_file = self._file("tokenizer.json")
        config = self._config()
        self._tokenizer = Tokenizer.from_file(str(tokenizer_file))
        self._specials = {
            name: _token_text(config.get(name)) for name in ("bos_token", "eos_token")
        }
        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
        )
        environment.globals["raise_exception"] = _raise
        environment.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        environment.filters["tojson"] = lambda value, indent=None: json.dumps(
            value, indent=indent, ensure_ascii=False
        )
        self._template_error = TemplateError
        try:
            self._template = environment.from_string(self._chat_template(config))
        except TemplateError as exc:
            raise ConfigError(
                f"the chat template in {self.directory} does not parse: {exc}"
            ) from None

    def __repr__(self) -> str:
        return f"LocalChatTokenizer({str(self.directory)!r})"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        return None

    async def tokenize_chat(
        self, request: Mapping[str, Any], *, model: str
    ) -> ChatTokens | Unavailable:
        """The prompt ids of a chat-completions body, rendered with the local template.

        Raises:
            ConfigError: the chat template refused the messages or failed on them.
        """
        continue_final = bool(request.get("continue_final_message", False))
        try:
            text = self._template.render(
                messages=list(request["messages"]),
                tools=request.get("tools"),
                add_generation_prompt=request.get("add_generation_prompt", not continue_final),
                **self._specials,
                **dict(request.get("chat_template_kwargs") or {}),
            )
        except self._template_error as exc:
            raise ConfigError(f"the chat template failed on the messages: {exc}") from None
        ids = self._tokenizer.encode(text, add_special_tokens=False).ids
        return ChatTokens(tokens=list(ids))

    async def detokenize(self, tokens: Sequence[int], *, model: str) -> str | Unavailable:
        return str(self._tokenizer.decode(list(tokens), skip_special_tokens=False))

    def _file(self, name: str) -> Path:
        path = self.directory / name
        if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
            raise ConfigError(
                f"no usable {name} in {self.directory}: give a local Hugging Face tokenizer dir"
            )
        return path

    def model_config(self) -> dict[str, Any]:
        """The dir's model `config.json` ({} when it has none: a tokenizer-only dir).

        Raises:
            ConfigError: a config.json that is not readable JSON.
        """
        return self._config("config.json")

    def _config(self, name: str = "tokenizer_config.json") -> dict[str, Any]:
        path = self.directory / name
        if not path.is_file():
            return {}
        try:
            loaded = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            raise ConfigError(f"{path} is not readable JSON") from None
        return loaded if isinstance(loaded, dict) else {}

    def _chat_template(self, config: Mapping[str, Any]) -> str:
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        if isinstance(template, str) and template:
            return template
        jinja = self.directory / "chat_template.jinja"
        if jinja.is_file():
            return self._file("chat_template.jinja").read_text(encoding="utf-8")
        raise ConfigError(f"{self.directory} has no chat template (chat_template.jinja)")


def _token_text(value: object) -> str:
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return "" if value is None else str(value)


def _raise(message: str) -> None:
    raise ConfigError(f"the chat template refused the messages: {message}")
