"""The managed stack behind one door: the engine, the `lmcache server` (and the coordinator it
joins) and vLLM.

`stack.Stack` holds the handles of one data dir, built once per call: the server's start, stop
(in the one order that never hangs vLLM), status and restart for one `Lifetime` (`lifetime.py`:
a session's lease or until stop, a strategy object), the engine's and vLLM's lifecycle verbs,
and which target (managed here or configured) a vLLM URL or coordinator names.
`start.start_vllm` brings up vLLM and, for an MP LMCache connector, the engine, coordinator and
lmcache server under it; a failed start stops what it started. `description.describe_stack` is
the running stack as one typed value read from our state files; `runtime` the read-only facts
other services inspect; `views` holds the status models. `store_host` publishes the engine on
the host's edge (a fleet's store host) and `coordinator_service` runs the managed coordinator as
a service of its own, published with its nodes' callback routes. Tools, commands and the other
services call this package, never a process or stack connector.
"""
