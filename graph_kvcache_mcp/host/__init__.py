"""The MCP runtime: what any server built on the SDK needs, apart from our tools.

`strict_server` (closed schemas, argument errors a model can act on, runtime tool additions),
`tool_schemas` (leaner schemas), `jsonrpc` and `stdio_guard` (every malformed stdio line
answered), `http_app` and `http_guard` (the streamable-HTTP app, its bearer-token and error
gates, the header deadline), `stdio` (serving over stdio, signals), `registrar` (the protocol
toolsets register through) and `catalog` (the one toolset table). `server.py` composes them.
"""
