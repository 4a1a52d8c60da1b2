"""Where each argument of a command line stands, for the parser's one-line errors (`attnconv.cli._Parser`): which
(sub)command an option belongs to, an option given before its command's name, options a command does not take.
Plain reading of argv against argparse's parsers; nothing here parses values."""

from __future__ import annotations

import argparse
import re


def chosen_parsers(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[argparse.ArgumentParser]:
    """The parsers of the command `args` chose, from the top level to the innermost subcommand."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(args, action.dest, None) or "")
            if chosen is not None:
                return [parser, *chosen_parsers(chosen, args)]
    return [parser]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """{name: parser} of `parser`'s subcommands ({} for a command that has none)."""
    return next((dict(a.choices) for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})


def valued_option_before_its_command(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """The error of an option that takes a value, given before the name of the (sub)command that takes it, whose value
    argparse then read as the command's name; None where argv holds none."""
    end = argv.index("--") if "--" in argv else len(argv)
    levels = [parser]  # levels[k]: the (sub)command the arguments after argv[:k] are read by
    for arg in argv[:end]:
        levels.append(_subcommands(levels[-1]).get(arg, levels[-1]))
    for i, arg in enumerate(argv[:end - 1]):
        if not arg.startswith("-") or arg == "-" or "=" in arg or _takes_option(levels[i], arg):
            continue
        later = [levels[k] for k in range(i + 2, end + 1) if levels[k] is not levels[i]]
        taker = next((p for p in later if _takes_option(p, arg)), None)
        if taker is not None and _option_action(taker, arg).nargs == 0:
            continue  # a flag (`--json`): what follows it is no value of it
        if taker is not None:
            return (f"{parser.prog}: {arg} {argv[i + 1]} is an option of `{taker.prog}` and its value, given before its "
                    f"name: put them after `{taker.prog}` (see `{taker.prog} --help`)")
        if later:  # read as the command's name only because an option no command here takes stood before it
            command = later[-1]
            like = sorted(o for o in command._option_string_actions if o.startswith(arg))
            said = f"could be {', '.join(like)} of `{command.prog}`" if len(like) > 1 else \
                f"is an option neither `{levels[i].prog}` nor `{command.prog}` takes"
            return (f"{parser.prog}: {arg}, given before `{command.prog}`, {said} (see `{command.prog} --help`); "
                    f"options go after the command's name")
    return None


def unknown_options(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """The error of options in argv that the (sub)command they stand after does not take (`attnconv eval -x`, which
    argparse reports as a missing RUN_DIR: it counts the required arguments first); None where argv holds none."""
    end = argv.index("--") if "--" in argv else len(argv)
    level, unknown, i = parser, [], 0
    while i < end:
        arg = argv[i]
        level = _subcommands(level).get(arg, level)
        action = _option_action(level, arg)
        if action is None and arg.startswith("-") and arg != "-" and not _negative_number(level, arg):
            unknown.append(arg)
        i += 2 if action is not None and action.nargs != 0 and "=" not in arg else 1  # its value too
    if not unknown:
        return None
    return f"{level.prog}: unrecognized arguments: {' '.join(unknown)} (see `{level.prog} --help`)"


def _negative_number(parser: argparse.ArgumentParser, arg: str) -> bool:
    """Whether argparse reads `arg` as a value (a negative number: `-1`, `-.5`; not `-1e5` or `-inf`, which Python
    3.11's argparse reads as options), by the running argparse's own rule."""
    matcher = getattr(parser, "_negative_number_matcher", None) or re.compile(r"^-\d+$|^-\d*\.\d+$")
    return bool(matcher.match(arg)) and not getattr(parser, "_has_negative_number_optionals", [])


def misplaced(argv: list[str], chosen: list[argparse.ArgumentParser], args: argparse.Namespace,
              extra: str) -> argparse.ArgumentParser | None:
    """The chosen (sub)command whose option `extra` is, where `extra` stands in `argv` before that command's name
    (and before any `--`, after which every argument is a value); None where it stands elsewhere."""
    end = argv.index("--") if "--" in argv else len(argv)
    names = [getattr(args, a.dest) for p in chosen[:-1] for a in p._actions
             if isinstance(a, argparse._SubParsersAction) and getattr(args, a.dest, None)]
    where, start = [], 0
    for name in names:  # each command's name in argv, in order
        start = argv.index(name, start, end) + 1 if name in argv[start:end] else end
        where.append(start - 1)
    first = argv.index(extra, 0, end) if extra in argv[:end] else end
    for parser, at in reversed(list(zip(chosen[1:], where))):
        if first < at and _takes_option(parser, extra):
            return parser
    return None


def _option_action(parser: argparse.ArgumentParser, arg: str) -> argparse.Action | None:
    """The action of `parser` that reads `arg` (`--json`, `--top=3`, an abbreviation argparse would take), or None."""
    if not arg.startswith("-") or arg == "-":
        return None
    name = arg.split("=", 1)[0]
    if name in parser._option_string_actions:
        return parser._option_string_actions[name]
    longs = [a for o, a in parser._option_string_actions.items() if o.startswith("--") and o.startswith(name)]
    return longs[0] if parser.allow_abbrev and name.startswith("--") and len(longs) == 1 else None


def _takes_option(parser: argparse.ArgumentParser, arg: str) -> bool:
    """Whether `parser` reads `arg` as one of its options."""
    return _option_action(parser, arg) is not None
