"""`fabricctl top`: the live dashboard (Textual) and its one-shot Rich/JSON twin.

Contract:
- Importing this package, `render`, `draw`, `table`, `charts`, `gpu`, `sources` or
  `palette` never imports Textual; only `app` and `widgets` do, and the `top` command
  (`fabricctl.cli.top`) imports them lazily when a TTY asks for the live app. No other
  command imports anything of this package.
- Layering: the TUI imports only `fabricctl.core` (snapshots, events, signatures),
  `fabricctl.wire` (the client, in `sources`) and `fabricctl.fmt`, never the store, the
  server, the config or the CLI (import-linter contracts in pyproject.toml). Its data
  comes over the wire.
- Figures are formatted by `fabricctl.fmt`, the formatting the CLI uses too (it lives below
  both), so a figure reads the same in `fabricctl status` and in `top`.
"""
