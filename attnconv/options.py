"""Options written once: a config dataclass field carries its help, range and choices.

    @dataclass
    class TrainConfig:
        epochs: int = option(10, "training epochs", low=1, high=10**6)

`check_fields(config)` validates every field against its metadata and raises `FieldError`,
which names the field (`epochs`); the command line turns that name into its flag
(`--epochs`, `FieldError.as_flag`). `add_field_flags` derives argparse flags from the same
fields, and `field_ranges` gives the ranges the CLI checks before any work, so a range, a type
or a help text is never written twice.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import operator
import types
import typing
from collections.abc import Iterable, Sequence
from typing import Any

from attnconv.errors import ParameterError
from attnconv.limits import as_real, is_whole, shown_value


class FieldError(ParameterError):
    """A config field with a bad value: `epochs 0 is invalid: ...`; the CLI shows it as the flag that sets
    it (`as_flag`: `--epochs 0 is invalid: ...`)."""

    def __init__(self, field: str, value: Any, fix: str, *, flag: str | None = None, mentions: tuple[str, ...] = ()):
        self.field, self.fix = field, fix
        super().__init__(field, value, f"is invalid: {fix}", shown=_shown(value), mentions=mentions,
                         flags={field: flag} if flag else None)


def _shown(value: Any) -> str:
    """A field's value on one line: an array or tensor by its shape (`limits.shown_value`), a long repr cut."""
    text = shown_value(value) if getattr(value, "shape", None) is not None else " ".join(repr(value).split())
    return text if len(text) <= 60 else text[:57] + "..."


def option(default: Any = dataclasses.MISSING, help: str = "", *, low: float | None = None,
           high: float | None = None, high_open: bool = False, choices: Sequence[str] | None = None,
           fix: str | None = None, flag: str | None = None, cli: bool = True, metavar: str | None = None,
           section: str | None = None, default_factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field with its option metadata.

    Args:
        default / default_factory: as `dataclasses.field`.
        help: the flag's help text.
        low, high: the inclusive range of a number (`high_open`: high itself excluded); None values pass.
        choices: the allowed strings.
        fix: what to tell the user when the value is out of range (default: the range in words).
        flag: the flag's name when it is not the field's with dashes (`init-alpha` for `alpha`).
        cli: False for fields that get no flag of their own.
        section: the group of flags it is listed under in --help (`add_field_flags(section=...)`).
    """
    meta = {"help": help, "low": low, "high": high, "high_open": high_open, "choices": tuple(choices or ()),
            "fix": fix, "flag": flag, "cli": cli, "metavar": metavar, "section": section, "option": True}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=meta)


def option_fields(cls: type) -> list[dataclasses.Field]:
    """The fields of a config class that carry option metadata, in order."""
    return [f for f in dataclasses.fields(cls) if f.metadata.get("option")]


def flag_name(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or f.name.replace("_", "-")


def _is_int(x: Any) -> bool:
    return is_whole(x)  # numpy's integers and 0-d integer tensors too, stored as Python ints (`check_fields`)


def _numpy_bool(value: Any) -> bool:
    """Whether `value` is numpy's bool scalar (np.True_), taken as a bool field's value and stored as Python's."""
    return type(value).__module__ == "numpy" and getattr(value, "shape", None) == () and \
        str(getattr(value, "dtype", "")) == "bool"


def _scalar(hint: Any) -> Any:
    """int / float / str / bool of an annotation such as `int | None`; None for anything else."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        return inner[0] if len(inner) == 1 and inner[0] in (int, float, str, bool) else None
    return hint if hint in (int, float, str, bool) else None


def range_words(f: dataclasses.Field, kind: type) -> str:
    """"give a whole number from 1 to 1e+06" for a field's range."""
    m = f.metadata
    noun = "a whole number" if kind is int else "a number"
    lo, hi = m["low"], m["high"]
    if lo is not None and hi is not None:
        upper = f"below {hi:g}" if m["high_open"] else f"{hi:g}"
        return f"give {noun} from {lo:g} to {upper}" if not m["high_open"] else f"give {noun} >= {lo:g} and {upper}"
    if lo is not None:
        return f"give {noun} >= {lo:g}"
    return f"give {noun} <= {hi:g}"


def check_value(f: dataclasses.Field, value: Any, hint: Any) -> None:
    """Raise FieldError unless `value` fits field `f`'s type, range and choices."""
    m = f.metadata
    kind = _scalar(hint)
    if value is None:
        if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint):
            return
        raise FieldError(f.name, value, "give a value", flag=m.get("flag"))
    if kind is bool and not isinstance(value, bool) and not _numpy_bool(value):
        raise FieldError(f.name, value, "give true or false", flag=m.get("flag"))
    if kind is int and not _is_int(value):
        raise FieldError(f.name, value, m["fix"] or "give a whole number", flag=m.get("flag"))
    if kind is float and as_real(value) is None:  # numpy's floats and 0-d tensors too, stored as Python floats
        raise FieldError(f.name, value, m["fix"] or "give a number", flag=m.get("flag"))
    if kind is str and not isinstance(value, str):
        raise FieldError(f.name, value, "give a string", flag=m.get("flag"))
    if m["choices"] and value not in m["choices"]:
        raise FieldError(f.name, value, f"choose one of {', '.join(m['choices'])}", flag=m.get("flag"))
    if kind in (int, float) and (m["low"] is not None or m["high"] is not None):
        lo, hi = m["low"], m["high"]
        number = operator.index(value) if kind is int else as_real(value)
        try:  # an integer of 10**400 (JSON reads it) is past any float: out of range, not an OverflowError
            ok = math.isfinite(number) and (lo is None or number >= lo) and \
                (hi is None or (number < hi if m["high_open"] else number <= hi))
        except OverflowError:
            ok = False
        if not ok:  # the range said, after a fix that does not say it ("give a positive number": 1e-13 is one)
            words = range_words(f, kind)
            fix = m["fix"] if not m["fix"] or lo is None or f"{lo:g}" in m["fix"] else \
                f"{m['fix']}; the range: {words.split(' number ', 1)[1]}"
            raise FieldError(f.name, value, fix or words, flag=m.get("flag"))


def check_fields(obj: Any, names: Iterable[str] | None = None) -> None:
    """Check every option field of a config dataclass instance (or only `names`); FieldError on the first bad one."""
    hints = typing.get_type_hints(type(obj))
    wanted = None if names is None else set(names)
    for f in option_fields(type(obj)):
        if wanted is None or f.name in wanted:
            value = getattr(obj, f.name)
            check_value(f, value, hints[f.name])
            kind = _scalar(hints[f.name])
            if kind in (int, float, bool) and value is not None and type(value) is not kind:  # as config.json holds it
                object.__setattr__(obj, f.name, operator.index(value) if kind is int else as_real(value)
                                   if kind is float else bool(value))


class Below(float):
    """A range's upper end that is not in it (`high_open`): a value must be below it."""


def field_ranges(*classes: type) -> dict[str, tuple[float, float]]:
    """{argparse dest: (low, high)} of the numeric option fields of `classes` that have a flag (high a `Below` where
    the field's range excludes it)."""
    out: dict[str, tuple[float, float]] = {}
    for cls in classes:
        hints = typing.get_type_hints(cls)
        for f in option_fields(cls):
            if f.metadata["cli"] and _scalar(hints[f.name]) in (int, float) and \
                    (f.metadata["low"] is not None or f.metadata["high"] is not None):
                lo = f.metadata["low"] if f.metadata["low"] is not None else -math.inf
                hi = f.metadata["high"] if f.metadata["high"] is not None else math.inf
                out[flag_name(f).replace("-", "_")] = (lo, Below(hi) if f.metadata["high_open"] else hi)
    return out


def add_field_flags(group: Any, cls: type, names: Iterable[str] | None = None, *, section: str | None = None,
                    skip: Iterable[str] = ()) -> list[str]:
    """Add a flag for each option field of `cls` (all with `cli`, those of one `section`, or `names` in
    that order), default None.

    Numbers and strings take a value (with `choices` where the field has them); booleans get
    --flag / --no-flag. Returns the argparse dests added.
    """
    hints = typing.get_type_hints(cls)
    by_name = {f.name: f for f in option_fields(cls)}
    chosen = [by_name[n] for n in names] if names is not None else \
        [f for f in by_name.values() if f.metadata["cli"] and section in (None, f.metadata["section"])]
    dests = []
    for f in chosen:
        if f.name in set(skip):
            continue
        kind, m = _scalar(hints[f.name]), f.metadata
        flag = f"--{flag_name(f)}"
        dest = flag_name(f).replace("-", "_")
        help_text = m["help"].replace("%", "%%") if m["help"] else None
        if kind is bool:
            group.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            group.add_argument(flag, dest=dest, type=kind or str, choices=m["choices"] or None, default=None,
                               metavar=m["metavar"], help=help_text)
        dests.append(dest)
    return dests
