"""The `petal-dispatch` commands, one module per group; `petal_dispatch/cli.py` parses and dispatches.

Each command is `handler(args, settings) -> int` (the exit code): `args` as `cli.build_parser` parsed them,
`settings` read once from the environment by `cli.main`.
"""
