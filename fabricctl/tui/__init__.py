"""`fabricctl top`: the live dashboard (Textual) and its one-shot Rich/JSON twin.

Contract: importing this package, `render`, `draw`, `sources`, `palette` or `fmt` never
imports Textual; only `app` and `widgets` do, and the `top` command (`fabricctl.cli.top`)
imports them lazily when a TTY asks for the live app.
"""
