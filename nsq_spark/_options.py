"""One row per option, and the one parser of every table of them.

An option is one decision: its name, the attribute it lands in, what it accepts (a
:class:`~nsq_spark._validate.Limit`, choices, or a check of its own), its default, its
documentation, its aliases, and what it needs or excludes. Each is written once, as an
:class:`Option` row, and everything else reads the rows: the checks at construction, the
Spark options' parser, the command line's flags (:mod:`nsq_spark.cli`), the option tables
of the docs site (``docs/hooks/generate.py``) and the tests that probe each printed bound.
This is go-nsq's ``config.go`` (each field bounded and documented where it is declared)
in Python.

Rows are held two ways:

* as the fields of a dataclass (``name: float = option(5.0, limit=..., doc=...)``):
  :class:`~nsq_spark.config.ConnectionConfig`, :class:`~nsq_spark.config.ReaderOptions`
  and :class:`~nsq_spark.config.ProducerOptions`. The row sits where the field is declared,
  mypy sees the field's type, and :func:`check_fields` checks an instance;
* in an :class:`OptionTable` whose values arrive as text: the Spark data source's options
  (:mod:`nsq_spark.spark.options`), whose keys Spark hands over case-insensitively.
  :meth:`OptionTable.read` gives a :class:`Given` view that parses each value by its row
  on first use, so the parser pays only for the options it reads (write options are parsed
  once per Spark task).

One parser does what every table needs: an unknown name fails naming the closest known one
("did you mean"), an option that does nothing without another one fails instead of being
ignored, two options that exclude each other fail, and a secret (a row marked ``secret``,
or a name that looks like one: :func:`nsq_spark._validate.is_secret_name`) is never shown.
Numbers follow the one number rule of :mod:`nsq_spark._validate`.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import textwrap
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from . import _validate as validate
from .errors import ConfigError
from ._validate import Limit, is_secret_name, redact_options

__all__ = ["Option", "OptionTable", "Given", "option", "rows_of", "check_fields", "pick",
           "documented", "parse_duration", "closest"]

_T = TypeVar("_T")
_C = TypeVar("_C", bound=type)

#: What a row accepts, by kind: ``int`` (an int in the row's ``limit``), ``number`` (int or
#: float in it), ``seconds`` (a number; as text also a duration such as ``"5s"``),
#: ``flag`` (True or False; as text true/false/yes/no/on/off/1/0), ``text`` (a non-empty
#: string), ``choice`` (one of ``choices``), ``any`` (the row's ``check`` decides alone).
KINDS = ("int", "number", "seconds", "flag", "text", "choice", "any")
_NUMERIC = ("int", "number", "seconds")
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


@dataclasses.dataclass(frozen=True, eq=False)
class Option:
    """One option: everything about it, in one place."""

    #: The name users write: a keyword argument, or a Spark option key (camelCase).
    name: str
    #: See :data:`KINDS`.
    kind: str = "any"
    #: The value when the option is not given (None may also mean "computed": ``shown``).
    default: Any = None
    #: What it does, in the project's reST (the docs site turns it into Markdown).
    doc: str = ""
    #: The attribute (dataclass field) the value lands in; "" for options the parser's
    #: own code combines with others.
    attr: str = ""
    #: Numbers: the unit and the range (its ``special`` text is made from ``special``).
    limit: Limit | None = None
    #: ``choice``: the values accepted.
    choices: tuple[Any, ...] = ()
    #: None is accepted and means this (e.g. "nsqd's default").
    none: str | None = None
    #: Values that mean something (``{-1: "off"}``): accepted even outside the range.
    special: Mapping[Any, str] = dataclasses.field(default_factory=dict)
    #: Appended to the option's errors: a fix, or ``f(value)`` giving one for that value.
    hint: str | Callable[[Any], str] = ""
    #: The option's own rule, after its kind's: ``check(value, param) -> value``.
    check: Callable[[Any, str], Any] | None = None
    #: Text options of a table (:class:`Given`): ``parse(text, param) -> value``, instead
    #: of the kind's conversion.
    parse: Callable[[str, str], Any] | None = None
    #: Other names accepted for it (pynsq's spellings).
    aliases: tuple[str, ...] = ()
    #: The option it does nothing without (set, true, or above 0); ``why``: said with it.
    needs: str = ""
    #: Options it cannot be given with.
    excludes: tuple[str, ...] = ()
    #: Why it needs or excludes what it does, for the error.
    why: str = ""
    #: Never shown: in reprs, logs and errors its value is :data:`~nsq_spark._validate.REDACTED`.
    secret: bool = False
    #: The docs: the default in words when it is computed or not a value.
    shown: str = ""
    #: The docs: what to give, for options that are not numbers.
    unit: str = ""
    #: The docs: the rule, for options that are not numbers; for numbers, words appended
    #: to the range (a bound that depends on another option).
    rule: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"option {self.name}: kind {self.kind!r} is not one of {KINDS}")
        if self.kind == "seconds" and self.limit is None:
            object.__setattr__(self, "limit", validate.SECONDS_POSITIVE)
        if (self.kind in _NUMERIC) != (self.limit is not None):
            raise ValueError(f"option {self.name}: a number needs a limit, and only a "
                             "number has one")
        if self.limit is not None and not self.limit.special:
            object.__setattr__(self, "limit", self.limit._replace(
                special=special_text(self.special, self.none)))

    # -- what the docs print -----------------------------------------------------------

    @property
    def unit_text(self) -> str:
        if self.unit:
            return self.unit
        if self.limit is not None:
            return self.limit.unit
        if self.kind == "choice":
            return " or ".join(repr(c) for c in self.choices)
        return {"flag": "boolean", "text": "string"}.get(self.kind, "")

    @property
    def bounds_text(self) -> str:
        if self.limit is None:
            return self.rule
        return self.limit.bounds() + self.rule

    @property
    def default_text(self) -> str:
        """The default as a user writes it (``shown`` when it is computed or words)."""
        if self.shown:
            return self.shown
        value = self.default
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, float):
            return f"{value:g}"
        return "" if value is None else str(value)

    @property
    def is_secret(self) -> bool:
        return self.secret or is_secret_name(self.name)

    # -- the check of a value ------------------------------------------------------------

    def check_value(self, value: Any, param: str | None = None,
                    error: type[ConfigError] = ConfigError) -> Any:
        """``value`` if this row accepts it (converted by its ``check``), else ``error``
        naming ``param`` (default: the option's name)."""
        param = param or self.name
        kind = self.kind
        if kind in _NUMERIC:
            limit = self.limit
            assert limit is not None
            hint = self.hint(value) if callable(self.hint) else self.hint
            value = validate.number(
                value, param, lo=limit.lo, hi=limit.hi, lo_open=limit.lo_open,
                is_int=kind == "int", unit=limit.unit, special=self.special,
                none=self.none, hint=hint, error=error)
        elif kind == "flag":
            value = validate.flag(value, param, none=self.none, error=error)
        elif kind == "text":
            value = validate.text(value, param, none=self.none, nonempty=True, error=error)
        elif kind == "choice" and value not in self.choices and not (
                value is None and self.none is not None):
            raise error(f"{param}={value!r}: {closest(value, self.choices, '{!r}', '? ')}"
                        "give one of " + ", ".join(map(repr, self.choices))
                        + (f", or None ({self.none})" if self.none is not None else ""))
        if self.check is not None:
            value = self.check(value, param)
        return value

    def parse_text(self, text: str, param: str, error: type[ConfigError]) -> Any:
        """A value given as text (a Spark option), converted by the row's kind or its
        ``parse``, then checked as :meth:`check_value` does."""
        if self.parse is not None:
            return self.parse(text, param)
        kind = self.kind
        value: Any = text
        limit = self.limit
        if kind == "int":
            assert limit is not None
            try:
                value = int(text)
            except ValueError:
                lo = "" if limit.lo is None else f" >= {limit.lo:g}" if isinstance(
                    limit.lo, float) else f" >= {limit.lo}"
                raise error(f"{param} must be an integer{lo}, not {text!r}") from None
        elif kind == "seconds":
            assert limit is not None
            value = parse_duration(text)
            if value is None:
                raise error(f"{param} must be a number of seconds, {limit.bounds()}, or a "
                            "duration with a unit such as '500ms', '5s', '1m', "
                            f"not {text!r}")
        elif kind == "number":
            assert limit is not None
            value = _float(text)
            if value is None:
                raise error(f"{param} must be a number, {limit.bounds()}, not {text!r}")
        elif kind == "flag":
            low = text.lower()
            if low not in _TRUE + _FALSE:
                raise error(f"{param} must be true or false, not {text!r}")
            value = low in _TRUE
        return self.check_value(value, param, error)


def special_text(special: Mapping[Any, str], none: str | None) -> str:
    """``{-1: "off", 0: "nsqd's default"}``, None meaning "nsqd's default" in words:
    ``"-1: off; 0 or None: nsqd's default"`` (equal meanings said once)."""
    meanings: dict[str, list[str]] = {}
    for value, meaning in special.items():
        meanings.setdefault(meaning, []).append(repr(value))
    if none is not None:
        meanings.setdefault(none, []).append("None")
    return "; ".join(f"{' or '.join(values)}: {meaning}" for meaning, values in meanings.items())


def closest(value: Any, known: Iterable[Any], shown: str = "'{}'", end: str = "") -> str:
    """``"did you mean 'x'"`` (``shown`` formats it, ``end`` follows it) for the known
    value closest to ``value``; "" when none is close."""
    by_text = {str(k).lower(): k for k in known}
    close = difflib.get_close_matches(str(value).lower(), list(by_text), n=1, cutoff=0.6)
    return f"did you mean {shown.format(by_text[close[0]])}{end}" if close else ""


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


# Units of a duration, in seconds: Spark's (JavaUtils.timeStringAs, what the Kafka source
# reads its maxTriggerDelay with: us, ms, s, m, min, h, d) and their words; the Go tools'
# durations (2s, 500ms, 1m, 1h) are among them.
_DURATION_UNITS = {
    **dict.fromkeys(("us", "micro", "micros", "microsecond", "microseconds"), 1e-6),
    **dict.fromkeys(("ms", "milli", "millis", "millisecond", "milliseconds"), 1e-3),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1.0),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60.0),
    **dict.fromkeys(("h", "hour", "hours"), 3600.0),
    **dict.fromkeys(("d", "day", "days"), 86400.0),
}
_DURATION = re.compile(r"\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([a-zA-Z]*)\s*")


def parse_duration(raw: str) -> float | None:
    """Seconds of a duration: a plain number is seconds (Kafka's plain number is
    milliseconds; these options always took seconds), a number with a unit is converted
    (``"500ms"``, ``"5s"``, ``"1m"``, ``"2 minutes"``, ``"1h"``; case-insensitive). None
    when it is neither (the caller names the option). Range checks are the caller's."""
    m = _DURATION.fullmatch(raw)
    if m is None:
        # "inf", "nan": refused by the caller's range check, with the option's bounds
        return _float(raw)
    number, unit = m.groups()
    scale = _DURATION_UNITS.get(unit.lower()) if unit else 1.0
    return None if scale is None else float(number) * scale


# -- tables ---------------------------------------------------------------------------------


class OptionTable:
    """The rows of one kind of options, looked up by name or alias.

    ``what`` names them in errors (``"connection option"``); ``error`` is the error class
    raised; ``ignore_case``: names are matched without regard to case (Spark's)."""

    def __init__(self, rows: Iterable[Option], *, what: str,
                 error: type[ConfigError] = ConfigError, ignore_case: bool = False) -> None:
        self.rows = tuple(rows)
        self.what = what
        self.error = error
        self.ignore_case = ignore_case
        self._by_name: dict[str, Option] = {}
        for row in self.rows:
            for name in (row.name, *row.aliases):
                key = self._key(name)
                if key in self._by_name:
                    raise ValueError(f"{what}: {name!r} names two rows")
                self._by_name[key] = row
        for row in self.rows:
            for other in filter(None, (row.needs, *row.excludes)):
                if self._key(other) not in self._by_name:
                    raise ValueError(f"{what} {row.name}: needs or excludes {other!r}, "
                                     "which is not a row of the table")
        # what the checks walk, found once (Spark parses write options per task)
        self._needs = tuple((row, self[row.needs]) for row in self.rows if row.needs)
        self._excludes = tuple((row, self[other]) for row in self.rows
                               for other in row.excludes)
        self._checked = tuple(row for row in self.rows
                              if row.kind != "any" or row.check is not None)
        self._fields = tuple(row for row in self.rows if row.attr)
        # a row's name as the code spells it -> its key (no case folding per lookup)
        self._keys = {name: self._key(name) for name in self._by_name} | {
            row.name: self._key(row.name) for row in self.rows}

    def _key(self, name: str) -> str:
        return name.lower() if self.ignore_case else name

    def __iter__(self) -> Iterator[Option]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, name: str) -> Option:
        return self._by_name[self._key(name)]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._key(name) in self._by_name

    def __add__(self, other: "OptionTable") -> "OptionTable":
        return OptionTable(self.rows + other.rows, what=self.what, error=self.error,
                           ignore_case=self.ignore_case)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(row.name for row in self.rows)

    def find(self, name: str) -> Option | None:
        """The row named ``name`` (or one of its aliases); None if there is none."""
        return self._by_name.get(self._key(name))

    def limits(self) -> dict[str, Limit]:
        """name -> unit and bounds, for the numeric rows (what the docs print)."""
        return {row.name: row.limit for row in self.rows if row.limit is not None}

    def unknown(self, key: str, known: Iterable[str] = (), suffix: str = "") -> ConfigError:
        """The error for an option no row names: the closest known name, if one is close
        (``known``: names accepted besides the rows')."""
        names = [n for row in self.rows for n in (row.name, *row.aliases)] + list(known)
        hint = closest(key, names, end="?")
        return self.error(f"unknown {self.what} {key!r}{'; ' + hint if hint else ''}"
                          + suffix)

    def redact(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """``values`` fit for a repr or a log line: the secret rows' values hidden, and
        whatever :func:`~nsq_spark._validate.redact_options` hides (URL passwords, ...)."""
        shown = redact_options(values)
        for key, value in values.items():
            row = self.find(str(key))
            if row is not None and row.secret and value is not None:
                shown[key] = validate.REDACTED
        return shown

    # -- text values (Spark) ----------------------------------------------------------

    def read(self, options: Mapping[str, Any], *, known: Iterable[str] = (),
             prefixes: tuple[str, ...] = (), context: str = "",
             unknown_hint: str = "") -> "Given":
        """A view of ``options`` through the table: every key is a row's name (or in
        ``known``, or starts with one of ``prefixes``), and every option that needs
        another has it. Values are parsed on first use (:meth:`Given.get`)."""
        given = Given(self, options)
        extra = {self._key(k) for k in known}
        for key in options:
            low = self._key(str(key))
            if low in self._by_name or low in extra or any(
                    low.startswith(p) and len(low) > len(p) for p in prefixes):
                continue
            hint = closest(low, [n for row in self.rows for n in (row.name, *row.aliases)]
                           + list(known), end="?")
            raise self.error(f"unknown {self.what} '{key}'{context}; "
                             + (hint or f"known options: {', '.join(self.names)}")
                             + unknown_hint)
        for row, needed in self._needs:
            if given.given(row.name) and not given.get(needed.name):
                raise self.error(needs_message(row, needed, quote=True))
        for row, other in self._excludes:
            if given.get(row.name) and given.get(other.name):
                raise self.error(f"options '{row.name}' and '{other.name}' are exclusive: "
                                 f"{row.why or 'choose one'}")
        return given


def needs_message(row: Option, needed: Option, quote: bool) -> str:
    """"option 'x' only takes effect with 'y' = true; set ... or remove 'x'"."""
    condition = {"flag": " = true"}.get(needed.kind, "")
    if needed.kind == "int" and needed.limit is not None and needed.limit.lo == 0:
        condition = " > 0"
    fix = (f".option(\"{needed.name}\", \"true\")" if needed.kind == "flag" and quote
           else needed.name)
    why = f" ({row.why})" if row.why else ""
    if quote:
        return (f"option '{row.name}' only takes effect with '{needed.name}'{condition}"
                f"{why}; set {fix} or remove '{row.name}'")
    return (f"{row.name} only takes effect with {needed.name}{condition}{why}: give "
            f"{fix} too, or drop {row.name}")


class Given:
    """An option map read through its table: keys compared as the table compares them,
    values stripped (blank is not given) and parsed by their rows on first use."""

    def __init__(self, table: OptionTable, options: Mapping[str, Any]) -> None:
        self.table = table
        self._fold = key = table._key
        self._keys = table._keys
        self._rows = table._by_name
        self._raw: dict[str, str] = {}
        for k, v in dict(options).items():
            if v is not None:
                text = str(v).strip()
                if text:
                    self._raw[key(str(k))] = text
        self._parsed: dict[str, Any] = {}

    def _key(self, name: str) -> str:
        return self._keys.get(name) or self._fold(name)

    def text(self, name: str) -> str | None:
        """The option as given (stripped), None if it was not."""
        return self._raw.get(self._key(name))

    def given(self, name: str) -> bool:
        return self._key(name) in self._raw

    def get(self, name: str, default: Any = None) -> Any:
        """The option parsed by its row; if not given, ``default`` when one is passed
        (a default computed from other options), else the row's default."""
        key = self._keys.get(name) or self._fold(name)
        row = self._rows[key]
        raw = self._raw.get(key)
        if raw is None:
            return row.default if default is None else default
        parsed = self._parsed
        if key not in parsed:
            parsed[key] = row.parse_text(raw, f"option '{row.name}'", self.table.error)
        return parsed[key]

    def require(self, name: str, why: str) -> Any:
        if not self.given(name):
            raise self.table.error(f"option '{name}' is required: {why}; "
                                   f".option(\"{name}\", ...)")
        return self.get(name)

    def prefixed(self, prefix: str) -> dict[str, str]:
        """The options whose key starts with ``prefix``, without it (``nsq.<name>``)."""
        prefix = self._fold(prefix)
        return {k[len(prefix):]: v for k, v in self._raw.items()
                if k.startswith(prefix) and len(k) > len(prefix)}

    def fields(self) -> dict[str, Any]:
        """attribute -> value of every row that names its attribute (the options the
        parser's code does not combine with others)."""
        return {row.attr: self.get(row.name) for row in self.table._fields}


# -- rows as dataclass fields -----------------------------------------------------------


def option(default: _T, **row: Any) -> _T:
    """A dataclass field that is an option row (name and attribute: the field's; the
    rest: :class:`Option`'s keywords). Typed as its default, as ``dataclasses.field``."""
    Option(name="?", default=default, **row)  # a bad row fails where it is written
    # a secret is never in the dataclass's repr either
    field: Any = dataclasses.field(default=default, repr=not row.get("secret", False),
                                   metadata={"option": row})
    return field  # type: ignore[no-any-return]


def rows_of(cls: type, *, what: str, error: type[ConfigError] = ConfigError) -> OptionTable:
    """The table of the option fields of dataclass ``cls``, in their order."""
    rows = [Option(name=f.name, attr=f.name, default=f.default, **f.metadata["option"])
            for f in dataclasses.fields(cls) if "option" in f.metadata]
    table = OptionTable(rows, what=what, error=error)
    for row in table._checked:  # so that check_fields may take a default as checked
        row.check_value(row.default, error=error)
    return table


def check_fields(obj: Any, table: OptionTable,
                 needs_error: Callable[[Any, Option, list[Option]], str] | None = None
                 ) -> None:
    """Every field of ``obj`` by its row, then what each needs (an option changed from its
    default while the one it needs is unset) and excludes; the first problem raises the
    table's error naming the option and the fix. ``needs_error(obj, needed, rows)`` words the
    error of the ``rows`` given without ``needed`` (default: :func:`needs_message` of the
    first)."""
    error = table.error
    for row in table._checked:
        value = getattr(obj, row.attr)
        if value is not row.default:  # the defaults were checked with the table
            row.check_value(value, error=error)
    unmet: dict[str, list[Option]] = {}
    for row, needed in table._needs:
        if getattr(obj, row.attr) != row.default and not getattr(obj, needed.attr):
            unmet.setdefault(needed.name, []).append(row)
    for needed_name, rows in unmet.items():
        raise error(needs_error(obj, table[needed_name], rows) if needs_error is not None
                    else needs_message(rows[0], table[needed_name], quote=False))
    for row, other in table._excludes:
        if getattr(obj, row.attr) and getattr(obj, other.attr):
            raise error(f"choose one of {row.name} and {other.name}"
                        + (f": {row.why}" if row.why else ""))


def pick(table: OptionTable, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The values of ``arguments`` (a facade's keyword arguments) that are rows of
    ``table``, by attribute."""
    return {row.attr: arguments[row.name] for row in table.rows if row.name in arguments}


def documented(table: OptionTable, *, before: str) -> Callable[[_C], _C]:
    """A class decorator for a facade whose keyword arguments include ``table``'s rows:
    its docstring's ``Args:`` get an entry per row (the row's ``doc``), inserted before the
    entry that starts with ``before``. ``help()``, the docs site and every tool that reads
    the docstring at run time then describe each option from its row."""
    def decorate(cls: _C) -> _C:
        lines = (cls.__doc__ or "").split("\n")
        at = next((i for i, line in enumerate(lines) if line.strip().startswith(before)),
                  None)
        if at is None:
            raise ValueError(f"{cls.__name__}'s docstring has no Args entry {before!r}")
        indent = lines[at][:len(lines[at]) - len(lines[at].lstrip())]
        entries = [entry for row in table.rows for entry in textwrap.wrap(
            f"{row.name}: {row.doc}", width=92, initial_indent=indent,
            subsequent_indent=indent + "    ", break_on_hyphens=False)]
        cls.__doc__ = "\n".join(lines[:at] + entries + lines[at:])
        return cls
    return decorate
