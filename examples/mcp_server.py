"""Entry file for the MCP SDK's own launchers: `mcp run examples/mcp_server.py` and
`mcp dev examples/mcp_server.py` (the Inspector). They load a file and look for a module-level
server object named `server`; settings come from the environment, as for the console script.

Hosts should launch the console script (`graph-kvcache-mcp`) instead: it also stops a managed
engine on SIGTERM and takes flags such as --read-only.
"""

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.server import build_server

server = build_server(Settings.from_env())
