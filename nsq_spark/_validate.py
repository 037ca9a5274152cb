"""The one rule for numbers, strings and flags given by users, and for hiding secrets.

Every public constructor (``ConnectionConfig``, ``Reader``, ``Producer``, the dedup
structures, the Spark options, the CLI) checks its arguments here, at construction, so
that a bad value fails at once with a :class:`~nsq_spark.errors.ConfigError` naming the
parameter, the bad value and the fix -- instead of later, on an event loop, as an
``OverflowError`` or a connection that nsqd refuses for ever.

The rule:

* a number is an ``int`` or a ``float`` -- never a ``bool`` (``True`` is not 1 second)
  and never a ``str`` (``"5"`` is refused: Spark options and command lines are parsed
  into numbers by their own layer first, which then names the option);
* it is finite (``nan`` and ``inf`` are refused everywhere: no option means "for ever");
* an integer parameter takes an ``int`` only (``1.5`` and ``2.0`` are refused);
* it lies in the parameter's range; durations are capped at :data:`MAX_SECONDS`
  (a year: anything longer is a mistake, and overflows timers), in-process memory at
  :data:`MAX_MEMORY_BYTES`.

Secrets (the AUTH secret, passwords and secret keys inside URLs) are shown as
:data:`REDACTED` by :func:`redact_url` and :func:`redact_options`, which every options
object's ``repr`` uses.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple
from urllib.parse import parse_qsl, urlsplit

from .errors import ConfigError, InvalidBodyError

__all__ = ["MAX_SECONDS", "MAX_MEMORY_BYTES", "MAX_DEFER_MS", "REDACTED", "number",
           "integer", "seconds", "text", "flag", "defer_ms", "bodies", "is_secret_name",
           "redact_url", "redact_options"]

#: The longest duration any option takes, in seconds (365 days).
MAX_SECONDS = 365 * 86400
#: The most memory one in-process dedup structure may allocate (4 GiB); larger sizes
#: raise a ConfigError naming the parameters instead of a MemoryError (or swapping).
MAX_MEMORY_BYTES = 4 << 30


# -- machine-readable units and bounds ----------------------------------------------------
# Here, beside the checks: each option's row (nsq_spark._options) holds the Limit its
# values are checked by and the docs site prints.

class Limit(NamedTuple):
    """The unit and the accepted range of one numeric option."""

    unit: str
    lo: float | None = None
    hi: float | None = None
    #: True: ``lo`` itself is refused (the option must be above it).
    lo_open: bool = False
    #: Values outside the range that mean something, in words (``"-1: off"``).
    special: str = ""

    def bounds(self) -> str:
        """The range in words: ``"> 0 .. 31536000"``, ``"1 .. 60"``, ``">= 1"``."""
        def num(x: float) -> str:
            if isinstance(x, int):  # exactly (2 ** 63 - 1 is not a float)
                return f"{x:,}"
            return f"{x:,.0f}" if float(x).is_integer() else f"{x:g}"
        lo = "" if self.lo is None else ("> " if self.lo_open else "") + num(self.lo)
        if self.hi is None:
            text = ("> " if self.lo_open else ">= ") + num(self.lo) if self.lo is not None else ""
        else:
            text = f"{lo or '...'} .. {num(self.hi)}"
        return f"{text}; {self.special}" if self.special else text


#: :func:`seconds`' rule by default: > 0, at most :data:`MAX_SECONDS`.
SECONDS_POSITIVE = Limit("seconds", 0, MAX_SECONDS, lo_open=True)
#: :func:`seconds` with ``lo_open=False``: >= 0, at most :data:`MAX_SECONDS`.
SECONDS_OR_ZERO = Limit("seconds", 0, MAX_SECONDS)


#: The longest DPUB deferral the client sends, in ms: nsqd keeps it as a Go duration
#: (int64 nanoseconds). nsqd itself refuses more than its ``--max-req-timeout`` (1 h by
#: default) with E_INVALID.
MAX_DEFER_MS = (2 ** 63 - 1) // 1_000_000
#: What a secret looks like in a repr.
REDACTED = "***"


def _fmt(bound: float) -> str:
    return f"{bound:g}" if isinstance(bound, float) else str(bound)


def _expectation(kind: str, lo: float | None, hi: float | None, lo_open: bool,
                 hi_open: bool, special: Mapping[Any, str], none: str | None,
                 unit: str) -> str:
    what = kind + (f" of {unit}" if unit else "")
    if lo is not None and hi is not None and not lo_open and not hi_open:
        what += f" from {_fmt(lo)} to {_fmt(hi)}"
    else:
        if lo is not None:
            what += f" {'>' if lo_open else '>='} {_fmt(lo)}"
        if hi is not None:
            what += f"{' and' if lo is not None else ''} {'<' if hi_open else '<='} {_fmt(hi)}"
    extras = [f"{v!r} ({meaning})" for v, meaning in special.items()]
    if none is not None:
        extras.append(f"None ({none})")
    return what + (", or " + " or ".join(extras) if extras else "")


def number(value: Any, param: str, *, lo: float | None = None, hi: float | None = None,
           lo_open: bool = False, hi_open: bool = False, is_int: bool = False, unit: str = "",
           special: Mapping[Any, str] | None = None, none: str | None = None,
           hint: str = "", error: type[ConfigError] = ConfigError) -> Any:
    """``value`` if it is a number by the module's rule, else ``error`` naming ``param``.

    ``lo``/``hi``: inclusive bounds (``lo_open``/``hi_open``: the bound itself refused);
    ``is_int``: an ``int`` only; ``special``: values allowed outside the range, with
    their meaning (``{-1: "off"}``); ``none``: None is allowed and means this; ``hint``:
    appended to the message (e.g. "did you give milliseconds?"); ``error``: the
    ConfigError subclass raised (the Spark options raise NSQOptionError).
    """
    special = special or {}
    if value is None and none is not None:
        return None
    ok_type = (isinstance(value, int) if is_int else isinstance(value, (int, float))) \
        and not isinstance(value, bool)
    if ok_type and value in special:
        return value
    # an int is finite however large (math.isfinite would overflow converting it)
    finite = ok_type and (isinstance(value, int) or math.isfinite(value))
    in_range = finite and (lo is None or (value > lo if lo_open else value >= lo)) \
        and (hi is None or (value < hi if hi_open else value <= hi))
    if in_range:
        return value
    kind = "an int" if is_int else "a finite number"
    why = ""
    if not ok_type:
        why = f" ({type(value).__name__}, not {'int' if is_int else 'a number'})"
    elif not finite:
        why = " (not finite)"
    raise error(f"{param}={value!r}{why}: give "
                f"{_expectation(kind, lo, hi, lo_open, hi_open, special, none, unit)}"
                f"{'; ' + hint if hint else ''}")


def integer(value: Any, param: str, *, lo: int | None = None, hi: int | None = None,
            unit: str = "", special: Mapping[Any, str] | None = None,
            none: str | None = None, hint: str = "",
            error: type[ConfigError] = ConfigError) -> Any:
    """An ``int`` (not bool, not float) in ``lo..hi``; see :func:`number`."""
    return number(value, param, lo=lo, hi=hi, is_int=True, unit=unit, special=special,
                  none=none, hint=hint, error=error)


def seconds(value: Any, param: str, *, lo: float = 0, lo_open: bool = True,
            hi: float = MAX_SECONDS, special: Mapping[Any, str] | None = None,
            none: str | None = None, hint: str = "",
            error: type[ConfigError] = ConfigError) -> Any:
    """A finite duration in seconds, ``> 0`` by default (``lo_open=False``: ``>= lo``),
    at most :data:`MAX_SECONDS`; see :func:`number`."""
    return number(value, param, lo=lo, hi=hi, lo_open=lo_open, unit="seconds",
                  special=special, none=none, hint=hint, error=error)


def text(value: Any, param: str, *, none: str | None = None, nonempty: bool = False,
         error: type[ConfigError] = ConfigError) -> Any:
    """A ``str`` (``none``: None allowed, meaning that; ``nonempty``: not blank)."""
    if value is None and none is not None:
        return None
    if isinstance(value, str) and (value.strip() or not nonempty):
        return value
    what = "a non-empty string" if nonempty else "a string"
    alt = f", or None ({none})" if none is not None else ""
    raise error(f"{param}={value!r} ({type(value).__name__}): give {what}{alt}")


def flag(value: Any, param: str, *, none: str | None = None,
         error: type[ConfigError] = ConfigError) -> Any:
    """``True`` or ``False`` (not 0/1, not "true"); ``none``: None allowed, meaning that."""
    if isinstance(value, bool) or (value is None and none is not None):
        return value
    alt = f", or None ({none})" if none is not None else ""
    raise error(f"{param}={value!r} ({type(value).__name__}): give True or False{alt}")


def defer_ms(value: Any, param: str = "defer_ms", *, optional: bool = True) -> Any:
    """A DPUB deferral: an int of milliseconds from 0 to :data:`MAX_DEFER_MS` (nsqd
    refuses more than its ``--max-req-timeout``), or with ``optional`` None (a PUB)."""
    return integer(value, param, lo=0, hi=MAX_DEFER_MS, unit="milliseconds",
                   none="publish at once" if optional else None,
                   hint="nsqd refuses more than its --max-req-timeout (1 h by default)")


def bodies(value: Any, param: str = "bodies") -> Sequence[Any]:
    """The message bodies of an MPUB as a list (each body is checked by the body rule
    of :mod:`nsq_spark.protocol` when encoded). A single ``bytes`` or ``str``, None or a
    non-iterable raises :class:`~nsq_spark.errors.InvalidBodyError` naming ``param``."""
    if isinstance(value, (list, tuple)):
        return value
    if isinstance(value, (bytes, bytearray, memoryview, str)) or value is None \
            or not isinstance(value, Iterable):
        raise InvalidBodyError(
            f"{param}={_short(value)} ({type(value).__name__}): give a list of bytes "
            "bodies, e.g. [b'a', b'b'] (one message: publish(topic, body))")
    return list(value)


def _short(value: Any) -> str:
    text_ = repr(value)
    return text_ if len(text_) <= 60 else text_[:57] + "..."


# -- secrets -------------------------------------------------------------------------------

#: The one rule of which names hold a secret: options, query parameters and the command
#: line's flags (:mod:`nsq_spark._strict_argparse`) alike. Broad on purpose: hiding a value
#: that was not secret costs a less helpful message; showing one that was costs the secret.
_SECRET_NAME = re.compile(r"auth|secret|passw|token|credential|private|api.?key",
                          re.IGNORECASE)


def is_secret_name(name: str) -> bool:
    """Whether an option, query-parameter or command-line option name holds a secret
    (auth_secret, authSecret, ``--auth``, password, secret_key, session_token, api_key,
    ...)."""
    return bool(_SECRET_NAME.search(name))


def redact_url(value: Any) -> Any:
    """``value`` with a URL's password (``redis://:pw@host``) and secret query parameters
    (``?secret_key=...``) replaced by :data:`REDACTED`; anything else unchanged."""
    if not isinstance(value, str) or ("@" not in value and "=" not in value):
        return value
    out = value
    try:
        parts = urlsplit(value)
        password = parts.password
    except ValueError:
        password = None
        parts = None
    if parts is not None and password:
        userinfo = parts.netloc.rpartition("@")[0]
        user = userinfo.partition(":")[0]
        out = out.replace(userinfo + "@", f"{user}:{REDACTED}@", 1)
    query = value.partition("?")[2]
    for key, secret in parse_qsl(query, keep_blank_values=True):
        if secret and is_secret_name(key):
            out = re.sub(rf"([?&]{re.escape(key)}=)[^&#]*", rf"\g<1>{REDACTED}", out)
    return out


def redact_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of an options mapping fit for a repr or a log line: secret-named values as
    :data:`REDACTED`, URLs with their passwords hidden, nested mappings likewise."""
    out: dict[str, Any] = {}
    for key, value in options.items():
        if is_secret_name(str(key)) and value is not None:
            out[key] = REDACTED
        elif isinstance(value, Mapping):
            out[key] = redact_options(value)
        else:
            out[key] = redact_url(value)
    return out
