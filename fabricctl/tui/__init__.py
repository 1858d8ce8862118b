"""`fabricctl top`: the live dashboard (Textual) and its one-shot Rich/JSON twin.

Contract:
- Importing this package, `render`, `draw`, `table`, `charts`, `gpu`, `sources`, `palette`
  or `fmt` never imports Textual; only `app` and `widgets` do, and the `top` command
  (`fabricctl.cli.top`) imports them lazily when a TTY asks for the live app.
- Layering: the TUI imports only `fabricctl.core` (snapshots, events, signatures) and
  `fabricctl.wire` (the client, in `sources`), never the store, the server, the config or
  the CLI (import-linter contracts in pyproject.toml). Its data comes over the wire.
- `fmt` is fabricctl's one formatting module for numbers, percentages, ages and bytes; the
  CLI uses it too, so a figure reads the same in `fabricctl status` and in `top`.
"""
