"""The `fabricctl` command line: one module per command, the root app in `app`.

Contract:
- Each command lives in one module with its logic: `up` (+ the `Daemon` that `run` reuses),
  `run`, `consume`, `replay`, `submit` (+ `progress`), `results`, `status`, `doctor`,
  `down`, `top`, and the groups `shapes` (+ `inspect_view`) and `configcmd` (`config`).
  A module declares its Typer function as `command` (a group as `group`); `app` only builds
  the root app and registers them. `demo` is `make demo`'s script, not a command.
- Shared pieces: `support` (the common options, logging, and `guarded`/`report`, which
  apply `fabricctl.errors.exit_code_of`, the one error-to-exit-code mapping), `common`
  (finding the broker, JSON/TSV/Rich output rules), `ordered` (input-order output),
  `helpfmt` (the command and group classes every command is declared with, so `--help`
  shows its text as written and flowing).
  Numbers, percentages, ages and bytes are formatted by `fabricctl.fmt`, shared with the
  dashboard and below both; shape signatures by `fabricctl.core.signature.signature_hex`.
- Building the app imports Typer and the command modules only: Rich, the server, the store,
  the supervisor and the simulator are imported when a command runs. No command but `top`
  imports anything of `fabricctl.tui`, and `top` only inside its command (the Rich
  one-shot, or Textual when it opens the live dashboard on a terminal).
"""
