"""The dashboard's widgets; each one draws what a pure renderer in `fabricctl.tui` returns."""
