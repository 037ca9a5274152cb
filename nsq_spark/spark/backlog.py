"""How many messages wait on the channel: the driver asks nsqd's HTTP ``/stats``.

With ``lookupdHttpAddresses`` the nsqds holding the topic come from every lookupd's
``/lookup?topic=``; with ``nsqdTcpAddresses`` the driver needs ``nsqdHttpAddresses``.
The backlog of one nsqd is the channel's ``depth`` (memory + disk queue, excluding
in-flight and deferred messages, which come back to ``depth`` when they time out or
their delay ends); before the channel exists, the topic's depth (nsqd hands those
messages to the channel when it is created).
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger(__name__)

HTTP_TIMEOUT = 2.0


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT) as resp:
        return json.loads(resp.read())


def lookup_nsqd_http(lookupd_http_addresses: list[str], topic: str) -> set[str]:
    """``host:http_port`` of every nsqd any reachable lookupd lists for ``topic``."""
    found: set[str] = set()
    for addr in lookupd_http_addresses:
        url = f"http://{addr}/lookup?topic={urllib.parse.quote(topic)}"
        try:
            doc = _get_json(url)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:  # topic unknown to this lookupd
                continue
            log.warning("lookupd %s: /lookup failed: %s", addr, exc)
            continue
        except (OSError, ValueError) as exc:
            log.warning("lookupd %s: /lookup failed: %s", addr, exc)
            continue
        # nsqlookupd v1.x answers {"channels": [...], "producers": [...]}; older ones
        # wrapped it in {"data": ...}
        producers = doc.get("producers", doc.get("data", {}).get("producers", []))
        for p in producers:
            found.add(f"{p['broadcast_address']}:{p['http_port']}")
    return found


def nsqd_depth(http_address: str, topic: str, channel: str) -> int | None:
    """The channel's backlog on one nsqd; None if that nsqd did not answer."""
    url = (f"http://{http_address}/stats?format=json&include_clients=false"
           f"&topic={urllib.parse.quote(topic)}")
    try:
        doc = _get_json(url)
    except (OSError, ValueError) as exc:
        log.warning("nsqd %s: /stats failed: %s", http_address, exc)
        return None
    topics = doc.get("topics", doc.get("data", {}).get("topics", [])) or []
    for t in topics:
        if t.get("topic_name") != topic:
            continue
        for c in t.get("channels") or []:
            if c.get("channel_name") == channel:
                return int(c.get("depth", 0))
        return int(t.get("depth", 0))
    return 0


def backlog(topic: str, channel: str, nsqd_http_addresses: list[str],
            lookupd_http_addresses: list[str]) -> int | None:
    """Messages waiting on the channel across nsqds; None when nothing could be asked."""
    if lookupd_http_addresses:
        targets = sorted(lookup_nsqd_http(lookupd_http_addresses, topic))
        if not targets:
            return 0  # no nsqd has the topic yet
    else:
        targets = list(nsqd_http_addresses)
    if not targets:
        return None
    with ThreadPoolExecutor(max_workers=min(8, len(targets))) as pool:
        depths = list(pool.map(lambda a: nsqd_depth(a, topic, channel), targets))
    known = [d for d in depths if d is not None]
    if not known:
        return 0
    return sum(known)
