"""Stand-ins for a deduplicator in the unit tests, in a module of their own so that
tests/test_typing.py checks them with ``mypy --strict`` against the ports they stand in
for (:class:`~nsq_spark.dedup.ClaimingDeduplicator`, the older
:class:`~nsq_spark.dedup.Deduplicator`); a stand-in that drifts fails there."""

from __future__ import annotations

from typing import Sequence

from nsq_spark.dedup import NEW, Claim, ClaimingDeduplicator, Deduplicator, Key
from nsq_spark.dedup.base import key_bytes

__all__ = ["ScriptedClaims", "OneStep", "OneStepWithContains"]


class ScriptedClaims:
    """A claiming deduplicator whose answers the test sets (``answers[key]``, NEW by
    default), recording every call as ``(method, keys, lease_ms)``; a method named in
    ``failing`` raises ConnectionError (a store that is down)."""

    def __init__(self) -> None:
        self.answers: dict[bytes, Claim] = {}
        self.calls: list[tuple[str, list[bytes], int | None]] = []
        self.failing: set[str] = set()

    def _record(self, method: str, keys: Sequence[Key], lease_ms: int | None) -> list[bytes]:
        ks = [key_bytes(k) for k in keys]
        self.calls.append((method, ks, lease_ms))
        if method in self.failing:
            raise ConnectionError(f"stand-in store: {method} fails")
        return ks

    def claim_many(self, keys: Sequence[Key], lease_ms: int) -> list[Claim]:
        return [self.answers.get(k, NEW) for k in self._record("claim", keys, lease_ms)]

    def commit_many(self, keys: Sequence[Key]) -> None:
        self._record("commit", keys, None)

    def release_many(self, keys: Sequence[Key]) -> None:
        self._record("release", keys, None)

    def renew_many(self, keys: Sequence[Key], lease_ms: int) -> None:
        self._record("renew", keys, lease_ms)

    def keys_of(self, method: str) -> list[bytes]:
        """Every key passed to ``method`` so far, in order (other entries in the log, a
        fake connection's writes when a test shares one log, are skipped)."""
        return [k for call in self.calls if call[0] == method for k in call[1]]


class OneStep:
    """A user-made deduplicator of the older interface only: a set."""

    def __init__(self) -> None:
        self.seen: set[bytes] = set()
        self.checks = 0

    def check_and_set(self, key: Key) -> bool:
        self.checks += 1
        k = key_bytes(key)
        if k in self.seen:
            return True
        self.seen.add(k)
        return False

    def erase(self, key: Key) -> None:
        self.seen.discard(key_bytes(key))


class OneStepWithContains(OneStep):
    """The same, with ``__contains__`` (the adapter checks without marking)."""

    def __contains__(self, key: Key) -> bool:
        return key_bytes(key) in self.seen


# mypy --strict (tests/test_typing.py): the stand-ins fit the ports
_CLAIMING_CHECK: ClaimingDeduplicator = ScriptedClaims()
_ONE_STEP_CHECK: Deduplicator = OneStep()
