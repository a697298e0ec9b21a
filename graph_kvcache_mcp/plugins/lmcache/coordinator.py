"""`lmcache coordinator` as the managed stack runs it:
`python -m graph_kvcache_mcp.plugins.lmcache.coordinator coordinator <its flags>`.

LMCache's coordinator (0.5.6) has no authentication and listens on loopback TCP. Its answers hold
what was prompted (`/directory/keys` and `/directory/lookup` return chunks' token ids, and a
lookup by token ids tells whether a prompt was sent), and its writes decide what we report
(`/events` fences or fills a server's view, `/instances` registers and deletes servers, `/quota`
changes quotas). So every route is served to our own user only (`owner_only.OwnerOnly`): our
servers and our tools run as that user; another local user is answered 403.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from graph_kvcache_mcp.plugins.owner_only import OwnerOnly


def main(argv: Sequence[str] | None = None) -> None:
    # LMCache's heavy imports happen here, inside the coordinator process, never at import.
    import lmcache.v1.mp_coordinator.app as coordinator_app
    from lmcache.cli.main import main as lmcache_main

    build = coordinator_app.create_app

    def owner_only_app(*args: Any, **kwargs: Any) -> Any:
        app = build(*args, **kwargs)
        app.add_middleware(OwnerOnly)
        return app

    # LMCache's `coordinator` command imports `create_app` from the module when it runs.
    coordinator_app.create_app = owner_only_app
    lmcache_main(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
