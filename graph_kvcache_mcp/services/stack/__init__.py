"""The managed stack behind one door: the engine, the `lmcache server` (and the coordinator it
joins) and vLLM.

`start.start_vllm` brings up vLLM and, for an MP LMCache connector, the engine, coordinator and
lmcache server under it, for one `Lifetime` (`lifetime.py`: a session's lease or until stop); a
failed start stops what it started. `description.describe_stack` is the running stack as one
typed value read from our state files. `lmcache`, `engine` and `vllm` start, report on, restart
and stop each piece; `views` holds the tools' status models. Tools and commands call this
package, never a process or stack connector.
"""
