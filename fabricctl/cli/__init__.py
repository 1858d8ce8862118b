"""The logic behind fabricctl's client commands; `fabricctl.cli` only declares them.

One module per command family: `submit` (+ `progress`), `results`, `shapes`
(+ `inspect_view`), `status` (+ `down`), `doctor`, `configcmd`; `common` holds what they
share (finding the broker, JSON/TSV/Rich output rules). Modules import Rich lazily where
they can, never Textual.
"""
