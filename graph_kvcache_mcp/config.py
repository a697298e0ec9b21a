"""Settings: one pydantic model, read from the environment and overridden by CLI flags.

Precedence for the KV store address: `EPISTEMIC_GRAPH_KVCACHE_URL` > `EPISTEMIC_GRAPH_KVCACHE_ADDR`
> a managed engine's state file in the data dir > http://127.0.0.1:9130. Bad values raise
`ConfigError`; nothing falls back silently.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from graph_kvcache_mcp.domain.endpoints import parse_http_url, url_from_addr
from graph_kvcache_mcp.errors import ConfigError, describe_validation

APP_DIR_NAME = "graph-kvcache-mcp"
TOOLSETS = ("kv", "engine", "vllm", "lmcache", "bundle")
DEFAULT_TOOLSETS = ("kv", "engine", "vllm", "bundle")
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


def default_data_dir(environ: Mapping[str, str]) -> Path:
    """`$GRAPH_KVCACHE_DATA_DIR`, else the XDG data dir (`~/.local/share/graph-kvcache-mcp`)."""
    if explicit := environ.get("GRAPH_KVCACHE_DATA_DIR"):
        return Path(explicit).expanduser()
    xdg = environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg).expanduser() / APP_DIR_NAME


class Settings(BaseModel):
    """Everything the server, CLI and library read from outside. Secrets are `SecretStr`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kv_url: str | None = Field(
        None, description="Engine base URL; None means 'use the managed engine, else the default'."
    )
    kv_token: SecretStr | None = None
    kv_timeout_s: float = Field(5.0, gt=0, le=300)
    kv_concurrency: int = Field(8, ge=1, le=256, description="Parallel requests per batch.")
    data_dir: Path = Field(default_factory=lambda: default_data_dir(os.environ))

    engine_port: int | None = Field(None, ge=1, le=65535)
    engine_backend: Literal["durable", "memory"] = "durable"
    start_engine: bool = False
    keep_engine: bool = False

    read_only: bool = False
    toolsets: tuple[str, ...] = DEFAULT_TOOLSETS
    http_token: SecretStr | None = Field(
        None, description="Bearer token the HTTP transport requires (GRAPH_KVCACHE_HTTP_TOKEN)."
    )

    bundle_secret: SecretStr | None = Field(
        None,
        description="HMAC key for stored context bundles (GRAPH_KVCACHE_BUNDLE_SECRET): keys and "
        "entries are then signed, and unsigned entries are refused.",
    )

    vllm_base_url: str = "http://127.0.0.1:8000/v1"
    vllm_api_key: SecretStr | None = None
    vllm_model: str | None = None
    vllm_python: Path | None = Field(
        None, description="Interpreter of the venv that has vLLM; default: the current one."
    )
    vllm_timeout_s: float = Field(120.0, gt=0, le=3600)
    lmcache_python: Path | None = Field(
        None, description="Interpreter of the venv that has LMCache; default: the current one."
    )

    @field_validator("kv_url")
    @classmethod
    def _check_kv_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        return parse_http_url(value, what="EPISTEMIC_GRAPH_KVCACHE_URL").url

    @field_validator("vllm_base_url")
    @classmethod
    def _check_vllm_url(cls, value: str) -> str:
        return parse_http_url(value, what="VLLM_BASE_URL").url

    @field_validator("toolsets")
    @classmethod
    def _check_toolsets(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = sorted(set(value) - set(TOOLSETS))
        if unknown:
            raise ValueError(f"unknown toolsets {unknown}; choose from {', '.join(TOOLSETS)}")
        return value

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read settings from `environ` (default `os.environ`); `overrides` (flags) win.

        Overrides whose value is None are ignored, so unset CLI flags leave the env in charge.

        Raises:
            ConfigError: a value is malformed; the message names the variable and the fix.
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {"data_dir": default_data_dir(env)}
        if url := env.get("EPISTEMIC_GRAPH_KVCACHE_URL", "").strip():
            values["kv_url"] = url
        elif addr := env.get("EPISTEMIC_GRAPH_KVCACHE_ADDR", "").strip():
            values["kv_url"] = url_from_addr(addr)
        if token := env.get("EPISTEMIC_GRAPH_KVCACHE_TOKEN", "").strip():
            values["kv_token"] = SecretStr(token)
        if timeout := env.get("EPISTEMIC_GRAPH_KVCACHE_TIMEOUT_S", "").strip():
            values["kv_timeout_s"] = _number(timeout, "EPISTEMIC_GRAPH_KVCACHE_TIMEOUT_S")
        if conns := env.get("EPISTEMIC_GRAPH_KVCACHE_MAX_CONNECTIONS", "").strip():
            values["kv_concurrency"] = int(
                _number(conns, "EPISTEMIC_GRAPH_KVCACHE_MAX_CONNECTIONS")
            )
        if "GRAPH_KVCACHE_READ_ONLY" in env:
            values["read_only"] = _flag(env["GRAPH_KVCACHE_READ_ONLY"], "GRAPH_KVCACHE_READ_ONLY")
        if toolsets := env.get("GRAPH_KVCACHE_TOOLSETS", "").strip():
            values["toolsets"] = split_list(toolsets)
        if http_token := env.get("GRAPH_KVCACHE_HTTP_TOKEN", "").strip():
            values["http_token"] = SecretStr(http_token)
        if bundle_secret := env.get("GRAPH_KVCACHE_BUNDLE_SECRET", "").strip():
            values["bundle_secret"] = SecretStr(bundle_secret)
        if vllm_url := env.get("VLLM_BASE_URL", "").strip():
            values["vllm_base_url"] = vllm_url
        if vllm_key := env.get("VLLM_API_KEY", "").strip():
            values["vllm_api_key"] = SecretStr(vllm_key)
        if vllm_python := env.get("GRAPH_KVCACHE_VLLM_PYTHON", "").strip():
            values["vllm_python"] = Path(vllm_python)
        if lmcache_python := env.get("GRAPH_KVCACHE_LMCACHE_PYTHON", "").strip():
            values["lmcache_python"] = Path(lmcache_python)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.build(**values)

    @classmethod
    def build(cls, **values: Any) -> Settings:
        """Construct, turning pydantic's validation error into one readable `ConfigError`."""
        try:
            return cls(**values)
        except ValidationError as exc:
            problems = describe_validation(exc, whole="settings")
            raise ConfigError(f"invalid settings: {problems}") from None


def split_list(text: str) -> tuple[str, ...]:
    """Split a comma-separated setting, dropping blanks."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _number(text: str, name: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{name}={text!r} is not a number") from None


def _flag(text: str, name: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(f"{name}={text!r}: use true/false (or 1/0)")
