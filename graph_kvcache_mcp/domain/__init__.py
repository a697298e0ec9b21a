"""Pure logic: no I/O, no clock, no environment, no mutable globals."""
