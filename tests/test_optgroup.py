"""`cli.optgroup.takes`: a group's options reach Typer as the command's own and its body as one
object; `omit` and a replaced option change that for one command; a clash is refused."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import typer
from typer.testing import CliRunner

from fabricctl.cli.optgroup import group_option, takes


@dataclass(frozen=True)
class Pair:
    """Why: the test's group."""

    left: str | None = group_option(typer.Option(None, "--left", help="The left one."))
    right: str | None = group_option(typer.Option(None, "--right", help="The right one."))


NONE = Pair()


def app_of(command: object) -> typer.Typer:
    app = typer.Typer()
    app.command()(command)  # type: ignore[arg-type]
    return app


def test_the_group_is_given_whole_beside_the_commands_own_options() -> None:
    seen: list[tuple[str, Pair]] = []

    @takes(Pair)
    def command(name: str = typer.Option("x", "--name"), pair: Pair = NONE) -> None:
        seen.append((name, pair))

    out = CliRunner().invoke(app_of(command), ["--name", "n", "--right", "r"])
    assert out.exit_code == 0, out.output
    assert seen == [("n", Pair(None, "r"))]
    help_text = CliRunner().invoke(app_of(command), ["--help"]).output
    assert "--left" in help_text and "The right one." in help_text


def test_omit_and_a_replaced_option() -> None:
    seen: list[Pair] = []

    @takes(Pair, omit=("left",), right=typer.Option("dflt", "--other", help="Renamed."))
    def command(pair: Pair = NONE) -> None:
        seen.append(pair)

    app = app_of(command)
    assert CliRunner().invoke(app, []).exit_code == 0
    assert CliRunner().invoke(app, ["--other", "o"]).exit_code == 0
    assert seen == [Pair(None, "dflt"), Pair(None, "o")]
    assert CliRunner().invoke(app, ["--left", "l"]).exit_code == 2  # no such option


def test_a_field_named_like_the_commands_own_parameter_is_refused() -> None:
    with pytest.raises(TypeError, match="left"):
        @takes(Pair)
        def command(left: str = "", pair: Pair = NONE) -> None: ...
    with pytest.raises(TypeError, match="no field"):
        takes(Pair, omit=("middle",))
    with pytest.raises(TypeError, match="no parameter of type Pair"):
        @takes(Pair)
        def other(name: str = "") -> None: ...
