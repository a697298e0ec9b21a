"""CLI subcommand groups. Each module has `register(subparsers)`; handlers take
`(args, settings)` and return an exit code: 0 ok, 1 miss / not found, 2 bad input,
3 store or server unavailable."""
