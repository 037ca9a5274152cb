"""Module-level names of pynsq's ``nsq.reader`` that real programs import besides
``Reader``, for ``from nsq_spark.reader import ...`` (re-exported there).

* :func:`_utf8_params`: pynsq's private helper that encodes a dict of URL query parameters
  (values: strings, bytes, numbers, lists or tuples of strings/bytes, None) to UTF-8
  bytes for ``urlencode(..., doseq=1)``. A real project that overrides
  ``Reader.query_lookupd`` builds its lookupd URL with it; it behaves as pynsq 0.9.1's:
  None values are left out, numbers become their ``str``, list and tuple items are encoded
  one by one, anything else is a ``TypeError``; a non-dict is refused with an error that
  is an ``AssertionError`` too (pynsq asserts).
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError

__all__ = ["_utf8_params"]


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    raise TypeError(f"expected bytes or a string, not {type(value)!r}")


def _utf8_params(params: dict[Any, Any]) -> dict[Any, bytes | list[bytes]]:
    """``params`` with every value UTF-8 encoded (see the module doc)."""
    if not isinstance(params, dict):
        raise ConfigError(f"_utf8_params takes a dict of URL parameters, not "
                          f"{type(params).__name__}")
    encoded: dict[Any, bytes | list[bytes]] = {}
    for key, value in params.items():
        if value is None:
            continue
        if isinstance(value, (int, float)):  # bool too, as pynsq: b"True"
            value = str(value)
        encoded[key] = ([_as_bytes(v) for v in value] if isinstance(value, (list, tuple))
                        else _as_bytes(value))
    return encoded
