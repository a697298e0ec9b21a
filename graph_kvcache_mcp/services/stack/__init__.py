"""The managed stack behind one entry point: the engine, the `lmcache server` and vLLM.

`start.start_vllm` brings up vLLM and, for an MP LMCache connector, the engine and lmcache server
under it, for one `Lifetime` (`lifetime.py`: a session's lease or until stop); a failed start
stops what it started. Tools and commands call this package, not the process connectors.
"""
