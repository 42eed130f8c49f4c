"""A command's ``key=value`` options, declared once (:class:`Option`, :class:`Options`): every command parses
them alike, so a misspelt key, a key given twice, a missing option or a value of the wrong type is refused in
one line, in the same words everywhere; and ``--help`` lists them from the same declarations."""
import textwrap
from dataclasses import dataclass
from typing import Any, Optional

from modforge.errors import ConfigError
from modforge.registry import suggest

TYPES = ("text", "int", "float", "bool", "choice")
MAX_DIGITS = 100  # a whole number longer than this is refused before int() reads it (a slip, not a number)
PLACEHOLDERS = {"text": "text", "int": "N", "float": "number"}


@dataclass(frozen=True)
class Option:
    """One ``key=value`` option: ``help`` is one line for ``--help``; ``low``/``high`` bound a number (inclusive);
    ``metavar`` is the placeholder in ``key=<metavar>`` (help, and the "is required" refusal)."""

    key: str
    help: str
    default: Any = None
    type: str = "text"
    choices: tuple = ()
    required: bool = False
    low: Optional[float] = None
    high: Optional[float] = None
    metavar: str = ""

    def __post_init__(self):
        if self.type not in TYPES or (self.type == "choice") != bool(self.choices):
            raise ValueError(f"option {self.key}: type {self.type!r} with choices {self.choices!r}")

    @property
    def usage(self) -> str:
        """``key=<metavar>``, or ``key=a|b`` for a choice or a bool."""
        if self.type in ("choice", "bool"):
            return f"{self.key}={'|'.join(self.choices or ('true', 'false'))}"
        return f"{self.key}=<{self.metavar or PLACEHOLDERS[self.type]}>"

    def bounds(self) -> str:
        if self.low is not None and self.high is not None:
            return f" from {self.low:,} to {self.high:,}"
        return f" >= {self.low}" if self.low is not None else f" <= {self.high}" if self.high is not None else ""

    def within(self, x: float) -> bool:
        return (self.low is None or x >= self.low) and (self.high is None or x <= self.high)

    def read(self, value: str) -> Any:
        """The value as its type, or one ConfigError naming ``key=value`` (shown up to 40 characters)."""
        shown = f"{self.key}={value[:40]}"
        if self.type == "bool":
            if value not in ("true", "false"):
                raise ConfigError(f"{shown}: true or false")
            return value == "true"
        if self.type == "choice":
            if value not in self.choices:
                raise ConfigError(f"{shown}: allowed values are {', '.join(self.choices)}."
                                  f"{suggest(value, list(self.choices))}")
            return value
        if self.type == "int":
            digits = value[1:] if value[:1] in ("+", "-") else value
            if not (digits.isascii() and digits.isdigit()) or len(digits) > MAX_DIGITS or not self.within(int(value)):
                long = len(digits) > MAX_DIGITS and self.high is None
                raise ConfigError(f"{shown}: a whole number{self.bounds()}"
                                  f"{f' (at most {MAX_DIGITS} digits)' if long else ''}")
            return int(value)
        if self.type == "float":
            try:
                x = float(value)
            except ValueError:
                x = None
            if x is None or not self.within(x):
                raise ConfigError(f"{shown}: a number{self.bounds()}")
            return x
        return value  # text: verbatim ('${...}' in a prompt is text, not a reference)


class Values(dict):
    """Every option's value (its default where not given); ``given``: the options given, as the text typed."""

    def __init__(self, *args):
        super().__init__(*args)
        self.given: dict = {}


@dataclass(frozen=True)
class Options:
    """A command's options. ``positional``: an argument before them (report's sweep directory); ``rest``: what
    every other ``key=value`` or ``~key`` word is (study: an override of the config); without it they are refused."""

    name: str  # e.g. "python -m modforge.export"
    options: tuple
    positional: Optional[Option] = None
    rest: str = ""

    def parse(self, argv: list) -> tuple:
        """``(values, rest)``: the options as a :class:`Values`, and the other words in order (with ``rest``)."""
        by_key = {o.key: o for o in self.options}
        values, rest, words = Values({o.key: o.default for o in self.options}), [], list(argv)
        if self.positional is not None:
            p = self.positional
            if not words or words[0].partition("=")[0].lstrip("+") in by_key:
                raise ConfigError(f"name the {p.metavar} first: {self.name} <{p.metavar}> [key=value ...] "
                                  "(see --help)")
            values[p.key] = words.pop(0)
        for word in words:
            key, eq, value = word.partition("=")
            key = key.lstrip("+")
            if eq and key in by_key:
                if key in values.given:
                    raise given_twice(key, values.given[key], word)
                values[key] = by_key[key].read(value)
                values.given[key] = value
            elif self.rest and (eq or word.startswith("~")):
                rest.append(word)
            else:
                other = f"; any other key=value or ~key is {self.rest}" if self.rest else ""
                raise ConfigError(f"{word!r}: expected key=value with key one of {', '.join(by_key)}{other}."
                                  f"{suggest(key, list(by_key))}")
        for o in self.options:
            if o.required and o.key not in values.given:
                raise missing(o)
        return values, rest

    def help(self) -> str:
        """The aligned ``Options:`` block of ``--help``, from the declarations."""
        rows = [(f"<{p.metavar}>", f"{p.help} (first; required)") for p in [self.positional] if p is not None]
        for o in self.options:
            note = "required" if o.required else None if o.default in (None, "") else \
                f"default {str(o.default).lower() if o.type == 'bool' else o.default}"
            rows.append((o.usage, o.help + (f" ({note})" if note else "")))
        if self.rest:
            rows.append(("key=value, ~key", f"any other word: {self.rest}"))
        width = max([len(usage) for usage, _ in rows if len(usage) <= 24] or [24]) + 2
        lines = ["Options (key=value, any order, each once):"]
        for usage, text in rows:
            first = f"  {usage:<{width}}"
            if len(usage) > width - 2:  # too wide for the column: the help on the next lines
                lines.append(first.rstrip())
                first = " " * (width + 2)
            lines += textwrap.wrap(text, 112, initial_indent=first, subsequent_indent=" " * (width + 2))
        return "\n".join(lines)


def missing(option: Option) -> ConfigError:
    """The refusal of a required option not given."""
    return ConfigError(f"{option.usage} is required (see --help)")


def given_twice(key: str, first: str, again: str) -> ConfigError:
    """The refusal of an option given twice: which one was meant cannot be told, and the last one winning without
    a word would hide the slip."""
    return ConfigError(f"{key}= given twice ({key}={first}, then {again}): give it once")
