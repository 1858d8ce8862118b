"""`fabricctl config show|default`: the configuration as TOML.

Contract: `group` is the `config` Typer group with `show` and `default` (the module is not
named `config` so that it never reads as `fabricctl.config`, the settings themselves); with
`--json` each prints the configuration as one JSON document instead.
`default` prints `config.to_toml(AppConfig())`, every key with its default.
`show` prints the effective configuration (`load_config` with the flags given) in the same
form, preceded by comment lines naming its sources in precedence order, and with
`# from <source>` after every key that a file, the environment or a flag set (a key without
such a comment has its default): the provenance `load_config` recorded while it loaded
(`AppConfig.set_by`), nothing read a second time. Both outputs are valid TOML that `--config`
accepts; a `[[servers]]` fleet is printed last, one table per server, and the single-model
keys it replaces are left out.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from fabricctl.cli.common import write_json
from fabricctl.cli.helpfmt import HelpCommand, HelpGroup
from fabricctl.cli.support import ConfigFile, DataDir, guarded, settings
from fabricctl.config import AppConfig, load_config, to_toml, user_config_path

JsonOut = typer.Option(False, "--json", help="Print one JSON document instead of TOML.")
group = typer.Typer(cls=HelpGroup, help="Print the configuration as TOML.", no_args_is_help=True)


@group.command("show", cls=HelpCommand)
def show_command(json_out: bool = JsonOut, data_dir: Path | None = DataDir,
                 config: Path | None = ConfigFile) -> None:
    """Print the effective configuration, each key set by a file, env or flag marked so."""
    flags = {"data_dir": data_dir}
    if json_out:
        cfg = settings(data_dir, config)
        guarded(lambda: write_json(cfg))
        return
    sys.stdout.write(guarded(lambda: show(config, flags)))


@group.command("default", cls=HelpCommand)
def default_command(json_out: bool = JsonOut) -> None:
    """Print every setting with its default value."""
    if json_out:
        write_json(AppConfig())
        return
    sys.stdout.write(default())


def annotate(text: str, where: dict[str, str]) -> str:
    """`to_toml`'s text with `# from <source>` after each key `where` names."""
    lines, section = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("[") and stripped.endswith("]"):
            section = stripped[1:-1]
        elif " = " in line:
            key = line.split(" = ", 1)[0].strip()
            full = f"{section}.{key}" if section else key
            if full in where:
                line = f"{line}  # from {where[full]}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def show(config: Path | None, flags: dict[str, Any]) -> str:
    cfg = load_config(config, flags)
    sources = ", ".join(("defaults", *cfg.sources))
    head = [
        "# fabricctl configuration in effect",
        f"# sources, lowest precedence first: {sources}",
        f"# user file: {user_config_path()} (FABRICCTL_CONFIG overrides); project file: "
        "./fabric.toml",
        "# a key without a '# from' comment has its default",
        "",
    ]
    return "\n".join(head) + annotate(to_toml(cfg), cfg.set_by)


def default() -> str:
    return to_toml(AppConfig())
