"""Settings: one pydantic model, read from the environment and overridden by CLI flags.

Precedence for the KV store address: `EPISTEMIC_GRAPH_KVCACHE_URL` > `EPISTEMIC_GRAPH_KVCACHE_ADDR`
> a managed engine's state file in the data dir > http://127.0.0.1:9130. For its token:
`EPISTEMIC_GRAPH_KVCACHE_TOKEN_FILE` (a private file holding it; what the processes we start get,
since an environment can be read back through their APIs) > `EPISTEMIC_GRAPH_KVCACHE_TOKEN`.
Bad values raise `ConfigError`; nothing falls back silently.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from graph_kvcache_mcp.domain.endpoints import (
    ENABLE_WORDS,
    FEED_HOSTS_ENV,
    INSECURE_HOSTS_ENV,
    approve_http_url,
    check_insecure_hosts,
    url_from_addr,
)
from graph_kvcache_mcp.domain.engine.environment import (
    KV_TIMEOUT_ENV,
    KV_TOKEN_ENV,
    KV_TOKEN_FILE_ENV,
    KV_URL_ENV,
)
from graph_kvcache_mcp.domain.file_roots import ROOTS_ENV, roots_from_setting
from graph_kvcache_mcp.domain.lifecycle import ServicePort
from graph_kvcache_mcp.domain.vllm.deadlines import (
    CALL_TIMEOUT_ENV,
    DEFAULT_CALL_TIMEOUT_S,
    DEFAULT_PROBE_TIMEOUT_S,
    PROBE_TIMEOUT_ENV,
)
from graph_kvcache_mcp.errors import ConfigError, describe_validation

# The toolset table is declared once, in host/catalog.py; settings name and validate from it.
from graph_kvcache_mcp.host.catalog import DEFAULT_TOOLSETS as DEFAULT_TOOLSETS
from graph_kvcache_mcp.host.catalog import TOOLSETS as TOOLSETS
from graph_kvcache_mcp.host.catalog import Endpoint as Endpoint

APP_DIR_NAME = "graph-kvcache-mcp"
LMCACHE_URL_ENV = "GRAPH_KVCACHE_LMCACHE_URL"
# The words that switch a setting on are the engine's (`ENABLE_WORDS`); these switch it off.
DISABLE_WORDS = frozenset({"0", "false", "no", "off", "disable", "disabled", ""})
_MAX_TOKEN_FILE_BYTES = 4096


def default_data_dir(environ: Mapping[str, str]) -> Path:
    """`$GRAPH_KVCACHE_DATA_DIR`, else the XDG data dir (`~/.local/share/graph-kvcache-mcp`)."""
    if explicit := environ.get("GRAPH_KVCACHE_DATA_DIR"):
        return Path(explicit).expanduser()
    xdg = environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg).expanduser() / APP_DIR_NAME


class Settings(BaseModel):
    """Everything the server, CLI and library read from outside. Secrets are `SecretStr`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Before the URLs: their validators read these two.
    insecure_http_hosts: tuple[str, ...] = Field(
        (),
        description="Hosts, IPs or CIDRs that may be sent plain http "
        "(GRAPH_KVCACHE_INSECURE_HTTP_HOSTS); loopback always may.",
    )
    insecure_feed_hosts: tuple[str, ...] = Field(
        (),
        description="Hosts, IPs or CIDRs whose unauthenticated KV-event feeds (ZMQ) a fleet "
        "may read (GRAPH_KVCACHE_INSECURE_FEED_HOSTS); loopback always may. Separate from "
        "insecure_http_hosts: neither list allows what the other does.",
    )
    endpoint_problems: tuple[tuple[Endpoint, str], ...] = Field(
        (),
        description="Endpoints refused at startup and why (only a server defers these: its "
        "toolsets that need the endpoint answer with the reason; elsewhere they raise).",
    )

    kv_url: str | None = Field(
        None, description="Engine base URL; None means 'use the managed engine, else the default'."
    )
    kv_token: SecretStr | None = None
    kv_timeout_s: float = Field(5.0, gt=0, le=300)
    kv_concurrency: int = Field(8, ge=1, le=256, description="Parallel requests per batch.")
    data_dir: Path = Field(default_factory=lambda: default_data_dir(os.environ))

    engine_port: ServicePort | None = None
    engine_backend: Literal["durable", "memory"] = "durable"
    start_engine: bool = False
    keep_engine: bool = False
    """Leave the managed engine, and the managed lmcache server, running on exit."""

    read_only: bool = False
    toolsets: tuple[str, ...] = DEFAULT_TOOLSETS
    http_token: SecretStr | None = Field(
        None, description="Bearer token the HTTP transport requires (GRAPH_KVCACHE_HTTP_TOKEN)."
    )

    file_roots: tuple[Path, ...] | None = Field(
        None,
        description="Directories tool paths must lie in (GRAPH_KVCACHE_FILE_ROOTS); None: the "
        "client's roots, else the working directory.",
    )

    bundle_secret: SecretStr | None = Field(
        None,
        description="HMAC key for stored context bundles (GRAPH_KVCACHE_BUNDLE_SECRET): keys and "
        "entries are then signed, and unsigned entries are refused.",
    )

    vllm_base_url: str = "http://127.0.0.1:8000/v1"
    vllm_api_key: SecretStr | None = None
    vllm_model: str | None = Field(
        None, description="Served model the vLLM and bundle tools default to (VLLM_MODEL)."
    )
    vllm_python: Path | None = Field(
        None, description="Interpreter of the venv that has vLLM; default: the current one."
    )
    vllm_timeout_s: float = Field(
        DEFAULT_CALL_TIMEOUT_S,
        gt=0,
        le=3600,
        description=f"{CALL_TIMEOUT_ENV}: a plain vLLM call's whole answer, or the gap "
        "between two chunks of a streamed one.",
    )
    vllm_probe_timeout_s: float = Field(
        DEFAULT_PROBE_TIMEOUT_S,
        gt=0,
        le=300,
        description=f"{PROBE_TIMEOUT_ENV}: a vLLM /health probe, /metrics scrape or model "
        "listing (never longer than the call deadline).",
    )
    lmcache_python: Path | None = Field(
        None, description="Interpreter of the venv that has LMCache; default: the current one."
    )
    fleet_file: Path | None = Field(
        None, description="The fleet file the fleet_* tools read (GRAPH_KVCACHE_FLEET)."
    )
    lmcache_port: ServicePort = Field(
        5555,
        description="GRAPH_KVCACHE_LMCACHE_PORT: the mp_native stack's "
        "lmcache server port (vLLM's MP connector connects there).",
    )
    lmcache_http_port: ServicePort = Field(
        8080, description="GRAPH_KVCACHE_LMCACHE_HTTP_PORT: its HTTP port."
    )
    lmcache_url: str | None = Field(
        None, description=f"{LMCACHE_URL_ENV}: a configured lmcache server's HTTP API (else ours)."
    )
    trust_unmanaged_coordinator: bool = Field(
        False,
        description="GRAPH_KVCACHE_TRUST_UNMANAGED_COORDINATOR: believe the L1 answers of an "
        "LMCache coordinator this data dir did not start (any local user may write to one).",
    )

    def endpoint_problem(self, endpoint: Endpoint) -> str | None:
        """Why `endpoint` was refused at startup (a server defers these), else None."""
        return dict(self.endpoint_problems).get(endpoint)

    @field_validator("insecure_http_hosts")
    @classmethod
    def _check_insecure_hosts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return check_insecure_hosts(value)

    @field_validator("insecure_feed_hosts")
    @classmethod
    def _check_feed_hosts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return check_insecure_hosts(value, variable=FEED_HOSTS_ENV)

    @field_validator("file_roots")
    @classmethod
    def _check_file_roots(cls, value: tuple[Path, ...] | None) -> tuple[Path, ...] | None:
        if value is not None and not all(root.expanduser().is_absolute() for root in value):
            raise ValueError(f"{ROOTS_ENV}: give absolute directories")
        return value

    @field_validator("kv_url")
    @classmethod
    def _check_kv_url(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None or "kv" in dict(info.data.get("endpoint_problems", ())):
            return value
        return _approve(value, "kv", info)

    @field_validator("vllm_base_url")
    @classmethod
    def _check_vllm_url(cls, value: str, info: ValidationInfo) -> str:
        if "vllm" in dict(info.data.get("endpoint_problems", ())):
            return value
        return _approve(value, "vllm", info)

    @field_validator("lmcache_url")
    @classmethod
    def _check_lmcache_url(cls, value: str | None, info: ValidationInfo) -> str | None:
        hosts = info.data.get("insecure_http_hosts", ())
        return value and approve_http_url(value, what=LMCACHE_URL_ENV, insecure_hosts=hosts).url

    @field_validator("toolsets")
    @classmethod
    def _check_toolsets(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = sorted(set(value) - set(TOOLSETS))
        if unknown:
            raise ValueError(f"unknown toolsets {unknown}; choose from {', '.join(TOOLSETS)}")
        return value

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        defer_endpoint_errors: bool = False,
        **overrides: Any,
    ) -> Settings:
        """Read settings from `environ` (default `os.environ`); `overrides` (flags) win.

        Overrides whose value is None are ignored, so unset CLI flags leave the env in charge.
        With `defer_endpoint_errors` (the server), a malformed or refused engine or vLLM URL is
        kept and recorded in `endpoint_problems` instead of raising, so the rest still serves.

        Raises:
            ConfigError: a value is malformed; the message names the variable and the fix.
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {"data_dir": default_data_dir(env)}
        values.update(_kv_endpoint(env, defer_endpoint_errors=defer_endpoint_errors))
        for variable, field, parse in ENV_SETTINGS:
            if variable in env and (value := parse(env[variable], variable)) is not None:
                values[field] = value
        values.update({k: v for k, v in overrides.items() if v is not None})
        if defer_endpoint_errors:
            values["endpoint_problems"] = _endpoint_problems(values)
        return cls.build(**values)

    @classmethod
    def build(cls, **values: Any) -> Settings:
        """Construct, turning pydantic's validation error into one readable `ConfigError`."""
        try:
            return cls(**values)
        except ValidationError as exc:
            problems = describe_validation(exc, whole="settings")
            raise ConfigError(f"invalid settings: {problems}") from None


ENDPOINT_SETTINGS: dict[Endpoint, tuple[str, str]] = {
    "kv": ("kv_url", KV_URL_ENV),
    "vllm": ("vllm_base_url", "VLLM_BASE_URL"),
}
"""Each endpoint's Settings field and the variable that names it in messages."""


def _approve(url: str, endpoint: Endpoint, info: ValidationInfo) -> str:
    hosts = info.data.get("insecure_http_hosts", ())
    return approve_http_url(url, what=ENDPOINT_SETTINGS[endpoint][1], insecure_hosts=hosts).url


def _endpoint_problems(values: dict[str, Any]) -> tuple[tuple[Endpoint, str], ...]:
    """Why each configured endpoint in `values` would be refused (none: empty)."""
    problems: dict[Endpoint, str] = dict(values.get("endpoint_problems", ()))
    try:
        hosts = check_insecure_hosts(values.get("insecure_http_hosts", ()))
    except ConfigError:
        return tuple(problems.items())  # the field's own validator reports it
    for endpoint, (field, variable) in ENDPOINT_SETTINGS.items():
        url = values.get(field)
        if url is None or endpoint in problems:
            continue
        try:
            approve_http_url(url, what=variable, insecure_hosts=hosts)
        except ConfigError as exc:
            problems[endpoint] = str(exc)
    return tuple(problems.items())


EnvParser = Callable[[str, str], Any]
"""(a variable's value as set, its name) -> the setting, or None to leave it at its default.

Raises ConfigError naming the variable when the value is malformed."""


def _kv_endpoint(env: Mapping[str, str], *, defer_endpoint_errors: bool) -> dict[str, Any]:
    """The engine's URL: `EPISTEMIC_GRAPH_KVCACHE_URL`, else one made of `..._ADDR` (kept as
    given, with the problem recorded, when malformed and errors are deferred)."""
    if url := env.get(KV_URL_ENV, "").strip():
        return {"kv_url": url}
    if not (addr := env.get("EPISTEMIC_GRAPH_KVCACHE_ADDR", "").strip()):
        return {}
    try:
        return {"kv_url": url_from_addr(addr)}
    except ConfigError as exc:
        if not defer_endpoint_errors:
            raise
        # Kept so nothing falls back to another engine.
        return {"kv_url": addr, "endpoint_problems": (("kv", str(exc)),)}


def _given(convert: Callable[[str], Any]) -> EnvParser:
    """A setting read from the stripped value; blank leaves the default."""
    return lambda text, _name: convert(text.strip()) if text.strip() else None


def _numeric(convert: Callable[[float], Any]) -> EnvParser:
    """A number (`convert` makes a whole one of it where the setting counts); blank: default."""
    return lambda text, name: convert(_number(text.strip(), name)) if text.strip() else None


def _roots(text: str, _name: str) -> tuple[Path, ...] | None:
    if not text.strip():
        return None
    return tuple(Path(root).expanduser() for root in roots_from_setting(text, separator=os.pathsep))


def token_from_file(text: str, name: str) -> SecretStr | None:
    """The token in the file `text` names: ours, a regular file, no link, unreadable by others
    (a token readable by anyone else is a leaked token)."""
    if not text.strip():
        return None
    path = Path(text.strip()).expanduser()
    fix = f"point {name} at a file of yours with mode 0600 holding only the token"
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"{name}: cannot open {path} ({exc.strerror}); {fix}") from None
    with os.fdopen(descriptor, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            raise ConfigError(f"{name}: {path} is not a regular file of this user; {fix}")
        if info.st_mode & 0o077:
            raise ConfigError(
                f"{name}: {path} is open to other users (mode {info.st_mode & 0o777:o}); {fix}"
            )
        token = handle.read(_MAX_TOKEN_FILE_BYTES + 1).decode("ascii", errors="replace").strip()
    if not token or len(token) > _MAX_TOKEN_FILE_BYTES:
        raise ConfigError(f"{name}: {path} holds no token (or more than a token); {fix}")
    return SecretStr(token)


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
    if lowered in ENABLE_WORDS:
        return True
    if lowered in DISABLE_WORDS:
        return False
    raise ConfigError(f"{name}={text!r}: use true/false (or 1/0)")


ENV_SETTINGS: tuple[tuple[str, str, EnvParser], ...] = (
    (INSECURE_HOSTS_ENV, "insecure_http_hosts", _given(split_list)),
    (FEED_HOSTS_ENV, "insecure_feed_hosts", _given(split_list)),
    (KV_TOKEN_ENV, "kv_token", _given(SecretStr)),
    (KV_TOKEN_FILE_ENV, "kv_token", token_from_file),  # after the variable: the file wins
    (KV_TIMEOUT_ENV, "kv_timeout_s", _numeric(float)),
    ("EPISTEMIC_GRAPH_KVCACHE_MAX_CONNECTIONS", "kv_concurrency", _numeric(int)),
    ("GRAPH_KVCACHE_READ_ONLY", "read_only", _flag),
    ("GRAPH_KVCACHE_TOOLSETS", "toolsets", _given(split_list)),
    ("GRAPH_KVCACHE_HTTP_TOKEN", "http_token", _given(SecretStr)),
    (ROOTS_ENV, "file_roots", _roots),
    ("GRAPH_KVCACHE_BUNDLE_SECRET", "bundle_secret", _given(SecretStr)),
    ("VLLM_BASE_URL", "vllm_base_url", _given(str)),
    ("VLLM_API_KEY", "vllm_api_key", _given(SecretStr)),
    ("VLLM_MODEL", "vllm_model", _given(str)),
    ("GRAPH_KVCACHE_VLLM_PYTHON", "vllm_python", _given(Path)),
    (CALL_TIMEOUT_ENV, "vllm_timeout_s", _numeric(float)),
    (PROBE_TIMEOUT_ENV, "vllm_probe_timeout_s", _numeric(float)),
    ("GRAPH_KVCACHE_LMCACHE_PYTHON", "lmcache_python", _given(Path)),
    ("GRAPH_KVCACHE_TRUST_UNMANAGED_COORDINATOR", "trust_unmanaged_coordinator", _flag),
    ("GRAPH_KVCACHE_FLEET", "fleet_file", _given(lambda text: Path(text).expanduser())),
    ("GRAPH_KVCACHE_LMCACHE_PORT", "lmcache_port", _numeric(int)),
    ("GRAPH_KVCACHE_LMCACHE_HTTP_PORT", "lmcache_http_port", _numeric(int)),
    (LMCACHE_URL_ENV, "lmcache_url", _given(str)),
)
"""Each variable `from_env` reads besides the engine's URL (`_kv_endpoint`), the Settings field
it sets and how its value is read, in the order they are read (the first malformed one is
reported)."""
