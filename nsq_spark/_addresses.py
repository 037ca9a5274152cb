"""One rule for ``host:port`` addresses, used by the Reader, the Producer, lookupd, the
dedup stores and the Spark options alike.

The rule: ``host:port`` where ``host`` is a DNS name, an IPv4 address or an IPv6 address
in brackets (``[::1]:4150``), and ``port`` is a decimal number from 1 to 65535. Anything
else (an empty host, a scheme such as ``http://``, ``host:port:extra``, a bare IPv6
address without brackets) raises :class:`~nsq_spark.errors.InvalidAddressError` naming
the parameter and the bad entry. Lists may be given as a sequence of strings or as one
comma-separated string (the form Spark options and command lines use).

lookupd HTTP addresses additionally accept ``http://`` / ``https://`` URLs (pynsq and
go-nsq accept them); :func:`parse_http_address` keeps that rule in the same place. An
HTTP address may carry user info (``http://user:password@host:4161``): it is sent as
``Authorization: Basic`` (:func:`http_authorization`, for a lookupd or an nsqd HTTP API
behind an authenticating proxy) and taken out of the address everything else sees and
shows (:func:`strip_userinfo`). No error of this module shows a password: an address is
shown with its password as ``***`` (:func:`redact_userinfo`).
"""

from __future__ import annotations

import base64
import ipaddress
import re
from collections.abc import Iterable
from typing import NamedTuple
from urllib.parse import unquote, urlsplit

from nsq_spark.errors import InvalidAddressError

__all__ = ["Address", "http_authorization", "ip_literal", "parse_address",
           "parse_address_list", "parse_http_address", "parse_http_address_list",
           "redact_userinfo", "split_list", "strip_userinfo"]

# a DNS name or an IPv4 address: letters, digits, dots, dashes, underscores
_HOSTNAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]{0,252})?")
_IPV6 = re.compile(r"\[([0-9A-Fa-f:.]+(%[A-Za-z0-9_.-]+)?)\]")


class Address(NamedTuple):
    """A parsed address. ``host`` carries no brackets; ``str()`` puts them back."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


#: ``scheme://user:password@`` (or ``user:password@`` without a scheme): the user info
#: of a URL-like address, up to its last ``@`` before the path
_USERINFO = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)?(?P<info>[^/?#]*)@")


def _bad(param: str, value: object, why: str, example: str) -> InvalidAddressError:
    shown = redact_userinfo(value) if isinstance(value, str) else value
    return InvalidAddressError(
        f"{param}: {shown!r} is not a valid address ({why}); "
        f"give 'host:port', e.g. {example!r} or '[::1]:4150'")


def redact_userinfo(text: str) -> str:
    """``text`` with the password of its user info shown as ``***``
    (``http://user:***@host:4161``); text without user info unchanged. What an error or a
    log line may show of an address."""
    m = _USERINFO.match(text)
    if m is None:
        return text
    user, sep, _ = m.group("info").partition(":")
    return f"{m.group('scheme') or ''}{user}{':***' if sep else ''}@{text[m.end():]}"


def strip_userinfo(text: str) -> str:
    """``text`` without its user info (``http://host:4161``): the address as everything
    but the Authorization header sees it (URLs, node names, logs, errors)."""
    m = _USERINFO.match(text)
    return text if m is None else f"{m.group('scheme') or ''}{text[m.end():]}"


def http_authorization(text: str) -> str | None:
    """The ``Authorization: Basic`` value of an HTTP address's user info
    (``http://user:password@host:4161``; percent-escapes decoded, as in any URL), or None
    when it has none."""
    m = _USERINFO.match(text.strip())
    if m is None:
        return None
    user, _, password = m.group("info").partition(":")
    token = f"{unquote(user)}:{unquote(password)}".encode("utf-8")
    return "Basic " + base64.b64encode(token).decode("ascii")


def parse_address(value: object, param: str = "address", example: str = "127.0.0.1:4150"
                  ) -> Address:
    """``"host:port"`` (or a ``(host, port)`` pair) as an :class:`Address`.

    ``param`` names the parameter in the error message, ``example`` is shown as the fix.
    """
    if isinstance(value, tuple) and len(value) == 2:
        host, port = value
        if not isinstance(host, str) or isinstance(port, bool) or not isinstance(port, int):
            raise _bad(param, value, "a pair must be (str host, int port)", example)
        return _checked(param, value, host.strip("[]"), str(port), example)
    if not isinstance(value, str):
        raise _bad(param, value, f"expected a string, got {type(value).__name__}", example)
    text = value.strip()
    if not text:
        raise _bad(param, value, "empty", example)
    if "://" in text or "/" in text:
        raise _bad(param, value, "a URL or path; give only host:port", example)
    if text.startswith("["):
        m = re.fullmatch(r"(\[[^\]]*\]):([^:]*)", text)
        if not m or not _IPV6.fullmatch(m.group(1)):
            raise _bad(param, value, "an IPv6 host must be '[addr]:port'", example)
        return _checked(param, value, m.group(1)[1:-1], m.group(2), example)
    host, sep, port = text.rpartition(":")
    if not sep:
        raise _bad(param, value, "no port", example)
    if ":" in host:
        raise _bad(param, value, "more than one ':' (an IPv6 host needs brackets)", example)
    return _checked(param, value, host, port, example)


def _checked(param: str, value: object, host: str, port: str, example: str) -> Address:
    if not host:
        raise _bad(param, value, "empty host", example)
    if ":" not in host and not _HOSTNAME.fullmatch(host):
        raise _bad(param, value, f"bad host {host!r}", example)
    if not port.isascii() or not port.isdigit():
        raise _bad(param, value, f"port {port!r} is not a number", example)
    number = int(port)
    if not 0 < number < 65536:
        raise _bad(param, value, f"port {number} is outside 1-65535", example)
    return Address(host, number)


def ip_literal(value: object) -> str | None:
    """The bare IP address of ``value`` when it is one, an IPv6 one possibly in brackets
    as in ``host:port`` (``"::1"``, ``"[::1]"``, ``"127.0.0.2"``), else None (a name, a
    port, unmatched brackets such as ``"[::1"``, not a string)."""
    if not isinstance(value, str):
        return None
    text = value
    if text.startswith("[") or text.endswith("]"):
        if not _IPV6.fullmatch(text):
            return None
        text = text[1:-1]
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return None
    return text


def split_list(value: object, param: str) -> list[object]:
    """A comma-separated string or a sequence of entries as a list of entries (blank
    entries of a string are skipped; anything else is kept for the caller to check)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [part for part in value.split(",") if part.strip()]
    if isinstance(value, (bytes, bytearray)) or not isinstance(value, Iterable):
        raise InvalidAddressError(
            f"{param}: expected a list of 'host:port' strings or one comma-separated "
            f"string, got {type(value).__name__}")
    return list(value)


def parse_address_list(value: object, param: str, example: str = "127.0.0.1:4150"
                       ) -> list[Address]:
    """Every entry of ``value`` (see :func:`split_list`) parsed, duplicates kept once,
    in the given order."""
    out: list[Address] = []
    for entry in split_list(value, param):
        address = parse_address(entry, param, example)
        if address not in out:
            out.append(address)
    return out


def parse_http_address(value: object, param: str = "lookupd_http_addresses",
                       example: str = "127.0.0.1:4161") -> tuple[str, Address, str]:
    """A lookupd / nsqd HTTP address: ``host:port``, ``host:port/path`` or an
    ``http(s)://host:port[/path]`` URL, with or without user info (``user:password@``:
    see :func:`http_authorization`). Returns ``(scheme, address, path)``."""
    if not isinstance(value, str):
        raise _bad(param, value, f"expected a string, got {type(value).__name__}", example)
    text = value.strip()
    if _USERINFO.match(text):
        text = strip_userinfo(text)  # sent as a header (http_authorization), not parsed
        value = redact_userinfo(value.strip())  # what errors below show
    if "://" not in text:
        if "/" not in text:
            return "http", parse_address(text, param, example), ""
        text = "http://" + text  # host:port/path, as pynsq takes it
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise _bad(param, value, f"scheme {parts.scheme!r}; only http and https", example)
    if parts.query or parts.fragment:
        raise _bad(param, value, "a query or fragment", example)
    return parts.scheme, parse_address(parts.netloc, param, example), parts.path.rstrip("/")


def parse_http_address_list(value: object, param: str = "lookupd_http_addresses",
                            example: str = "127.0.0.1:4161") -> list[str]:
    """Every entry of ``value`` (see :func:`split_list`) checked by
    :func:`parse_http_address` and kept as given (stripped; a URL keeps its scheme and
    path), duplicates once, in the given order."""
    out: list[str] = []
    for entry in split_list(value, param):
        parse_http_address(entry, param, example)
        text = str(entry).strip()  # a str: parse_http_address checked it
        if text not in out:
            out.append(text)
    return out
