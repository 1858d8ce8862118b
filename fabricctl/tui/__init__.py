"""`fabricctl top`: the live dashboard (Textual) and its one-shot Rich/JSON twin.

Contract: importing this package, `command`, `render`, `draw`, `sources`, `synthetic`,
`palette` or `fmt` never imports Textual; only `app` and `widgets` do, and `command`
imports them lazily when a TTY asks for the live app.
"""
