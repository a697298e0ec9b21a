"""The environment variables that tell a process where the engine is and how to reach it, each
named here once: our settings read them, the processes we start are given them, the config
generator refers to them (`${...}`) and messages name them.
"""

from __future__ import annotations

KV_URL_ENV = "EPISTEMIC_GRAPH_KVCACHE_URL"
"""The engine's base URL (wins over `..._ADDR`)."""
KV_TOKEN_ENV = "EPISTEMIC_GRAPH_KVCACHE_TOKEN"
"""The engine's bearer token (the engine itself reads its token from the same variable)."""
KV_TOKEN_FILE_ENV = f"{KV_TOKEN_ENV}_FILE"
"""A file holding the token: how the processes we start get it (never their environment)."""
KV_TIMEOUT_ENV = "EPISTEMIC_GRAPH_KVCACHE_TIMEOUT_S"
"""The deadline of one whole engine call."""
KV_TOKEN_REF = f"${{{KV_TOKEN_ENV}}}"
"""How a generated config or plan refers to the token without holding it."""
