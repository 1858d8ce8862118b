"""The dashboard's widgets; each one draws what a pure renderer in `fabricctl.tui` returns.

Contract: the only Textual code besides `fabricctl.tui.app`; a widget holds no data of its
own beyond what it was last given, keeps what it draws in Textual reactive attributes (so
the redraw follows the assignment, never a hand-called refresh after storing data), formats
nothing itself (`fabricctl.fmt`, through the renderers) and imports nothing of fabricctl
outside `fabricctl.tui`, `fabricctl.core` and `fabricctl.fmt`.
"""
