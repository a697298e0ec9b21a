"""The processes we start that use the managed engine (the `lmcache server`, vLLM): how they prove
the engine before its token leaves them, and how `engine stop` finds them."""
