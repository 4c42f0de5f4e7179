"""The `scaledl-lab run` flags, generated: one per config field, from the field's
:func:`scaledl_lab.families.option` metadata, the shared fields first, then an argument group
per family that declares options (its record's ``options`` dataclass). A flag left out is not
passed on, so the config's own defaults (the family's optimiser among them) apply."""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Iterator
from typing import Any

from .. import families
from ..config import CORE_FIELDS, ExperimentConfig, field_names


def flag_of(f: dataclasses.Field[Any]) -> str:
    """A field's spelling on the command line: ``--`` and its name with dashes, unless its
    metadata names another."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def _parser_of(hint: Any, name: str) -> Any:
    """The text parser of a field typed ``hint`` (int, float, str, or one of them or None)."""
    kind = hint
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        kinds = [a for a in typing.get_args(hint) if a is not type(None)]
        kind = kinds[0] if len(kinds) == 1 else None
    if kind in (int, float, str):
        return kind
    raise TypeError(f"config field {name!r}: give option(parse=...) to read {hint!r} from text")


def _default_text(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return ""
    return f" (default {value:g})" if isinstance(value, float) else f" (default {value})"


def _metavar(f: dataclasses.Field[Any], parse: Any) -> str | None:
    """The flag's placeholder: the field's own, its choices, N for counts, X for numbers."""
    choices = f.metadata.get("choices")
    shown = "|".join(choices) if choices else {int: "N", float: "X"}.get(parse)
    return f.metadata.get("metavar") or shown


def _is_switch(f: dataclasses.Field[Any], hint: Any) -> bool:
    return hint in (bool, bool | None) or isinstance(f.default, bool)


def _add(group: Any, f: dataclasses.Field[Any], hint: Any) -> None:
    meta = f.metadata
    if "help" not in meta:
        raise TypeError(f"config field {f.name!r} has no option(...) metadata: no flag for it")
    flag, help_text = flag_of(f), meta["help"]
    common = dict(dest=f.name, default=argparse.SUPPRESS)
    if meta.get("const") is not None:  # alone: const; or with a value
        parse = meta.get("parse") or _parser_of(hint, f.name)
        group.add_argument(
            flag, nargs="?", const=meta["const"], type=parse, metavar=_metavar(f, parse),
            help=help_text, **common,
        )  # fmt: skip
        return
    if _is_switch(f, hint):
        if f.default is None:  # on in a recipe unless a flag says
            group.add_argument(flag, action="store_const", const=True, help=help_text, **common)
            off = meta.get("off_flag") or "--no-" + flag.removeprefix("--")
            group.add_argument(
                off, action="store_const", const=False, help=f"the opposite of {flag}", **common
            )
        else:
            group.add_argument(
                flag, action="store_const", const=not f.default, help=help_text, **common
            )
        return
    parse = meta.get("parse") or _parser_of(hint, f.name)
    group.add_argument(
        flag,
        type=parse,
        metavar=_metavar(f, parse),
        help=help_text + _default_text(f.default),
        **common,
    )


def option_groups() -> Iterator[tuple[str, str, type]]:
    """(title, description, dataclass) of every group of config flags, the shared one first."""
    yield "the run (every strategy)", "", ExperimentConfig
    for family in families.with_options():
        assert family.options is not None
        yield f"{family.name} options", family.summary, family.options


def _fields(cls: type) -> tuple[dataclasses.Field[Any], ...]:
    return CORE_FIELDS if cls is ExperimentConfig else dataclasses.fields(cls)


def add_config_options(run: argparse.ArgumentParser) -> None:
    """A flag for every config field, in a group per family."""
    for title, description, cls in option_groups():
        group = run.add_argument_group(title, description or None)
        hints = typing.get_type_hints(cls)
        for f in _fields(cls):
            _add(group, f, hints[f.name])


def given_config(args: argparse.Namespace) -> dict[str, Any]:
    """The config fields the command line gave (the others keep the config's defaults)."""
    names = set(field_names())
    return {k: v for k, v in vars(args).items() if k in names}


def describe_options(cls: type) -> list[str]:
    """One line per flag of ``cls``'s fields (`scaledl-lab list`)."""
    lines = []
    hints = typing.get_type_hints(cls)
    for f in _fields(cls):
        flag = flag_of(f)
        if f.metadata.get("const") is not None:
            flag += f" [{_metavar(f, str)}]"
        elif _is_switch(f, hints[f.name]) and f.default is None:
            flag += " | " + (f.metadata.get("off_flag") or "--no-" + flag.removeprefix("--"))
        elif not _is_switch(f, hints[f.name]):
            parse = f.metadata.get("parse") or _parser_of(hints[f.name], f.name)
            flag += " " + (_metavar(f, parse) or f.name.upper())
        lines.append(f"{flag:28s} {f.metadata['help']}{_default_text(f.default)}")
    return lines
