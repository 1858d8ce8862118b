"""Option groups: options several commands take together, declared once, given to each
command's body as one object.

Contract: a group is a frozen dataclass whose every field has a default and carries its
Typer option in `metadata["option"]`. `@takes(Group, omit=(...), **options)` on a command
whose signature has one parameter annotated `Group` shows Typer the group's fields, in the
group's order and in that parameter's place, as the command's own options, and calls the
body with that parameter set to `Group(**their values)`. `options` replaces a field's
option for that command (another help or metavar); `omit` leaves a field out (its default
is what the body gets, and the command may have a parameter of that name). A field shown
named like one of the command's own parameters, an unknown field or a command without the
group's parameter is a TypeError at import.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def group_option(option: Any) -> Any:
    """A group's field: default None, shown to Typer as `option`."""
    return dataclasses.field(default=None, metadata={"option": option})


def takes(group: type, omit: Iterable[str] = (), **options: Any) -> Callable[[F], F]:
    """The decorator of the module contract."""
    left_out = frozenset(omit)
    hints = typing.get_type_hints(group)
    fields = [f for f in dataclasses.fields(group) if f.name not in left_out]
    unknown = (left_out | set(options)) - {f.name for f in dataclasses.fields(group)}
    if unknown:
        raise TypeError(f"{group.__name__} has no field {sorted(unknown)}")

    def wrap(fn: F) -> F:
        sig = inspect.signature(fn)
        fn_hints = typing.get_type_hints(fn)
        slot = next((n for n, h in fn_hints.items() if h is group), None)
        if slot is None:
            raise TypeError(f"{fn.__qualname__} has no parameter of type {group.__name__}")
        clash = {f.name for f in fields} & set(sig.parameters)
        if clash:
            raise TypeError(f"{fn.__qualname__}: {sorted(clash)} are also {group.__name__}'s")
        params: list[inspect.Parameter] = []
        for p in sig.parameters.values():
            if p.name != slot:
                params.append(p.replace(annotation=fn_hints.get(p.name, p.annotation)))
                continue
            params += [inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                         default=options.get(f.name, f.metadata["option"]),
                                         annotation=hints[f.name]) for f in fields]

        @functools.wraps(fn)
        def command(*args: Any, **kwargs: Any) -> Any:
            values = {f.name: kwargs.pop(f.name) for f in fields}
            return fn(*args, **kwargs, **{slot: group(**values)})

        command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return typing.cast(F, command)

    return wrap
