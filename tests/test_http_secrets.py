"""Authorization on the HTTP side, and no secret shown anywhere.

An address's user info (``http://user:password@host:port``) reaches the server as
``Authorization: Basic`` and the AUTH secret as ``Authorization: Bearer`` (the Reader to
lookupd, as go-nsq; the admin clients when given ``auth_secret``), checked on the wire by
a server the test starts. Then every path that shows an address or an error -- the
errors of the clients and of the address rule, their reprs, a Reader's addresses, stats
and every log line down to DEBUG, ``nsq-spark stat|topic|channel`` output and usage
errors -- is run with a password and a secret that must not appear in any of it (nor the
base64 of the credentials)."""

from __future__ import annotations

import base64
import io
import logging
import time

import pytest

from fake_nsqd import FakeConnections
from hostile_http import HostileHttp
from nsq_spark import cli
from nsq_spark.admin import LookupdClient, NsqdClient, delete_channel
from nsq_spark._consumer import Reader
from nsq_spark.errors import ConfigError, InvalidAddressError, NSQError
from nsq_spark._lookupd import lookup_sync
from nsq_spark.testing import free_port, wait_until

pytestmark = pytest.mark.timeout(60)

PASSWORD = "pw-Zq8xK1"
SECRET = "secret-Lm4vR7"
FORBIDDEN = (PASSWORD, SECRET, base64.b64encode(f"op:{PASSWORD}".encode()).decode(),
             base64.b64encode(f"op:{PASSWORD}".encode()).decode()[:12])


def assert_no_secret(*texts: object) -> None:
    for text in texts:
        for secret in FORBIDDEN:
            assert secret not in str(text), f"{secret!r} shown in: {text}"


def with_password(address: str) -> str:
    return f"http://op:{PASSWORD}@{address}"


# -- what is sent ---------------------------------------------------------------------


def test_user_info_is_sent_as_basic_and_the_secret_as_bearer():
    with HostileHttp("answer", b'{"version": "1.3.0", "tcp_port": 1}') as server:
        NsqdClient(with_password(server.address)).info()
        NsqdClient(server.address, auth_secret=SECRET).info()
        NsqdClient(with_password(server.address), auth_secret=SECRET).info()
        NsqdClient(server.address).info()
        sent = [server.headers(i).get("authorization") for i in range(4)]
        # the request line carries no user info either
        assert all(PASSWORD.encode() not in r for r in server.requests)
    basic = "Basic " + base64.b64encode(f"op:{PASSWORD}".encode()).decode()
    assert sent == [basic, f"Bearer {SECRET}", basic, None]


def test_lookup_sync_sends_user_info_as_basic():
    with HostileHttp("answer", b'{"producers": []}') as server:
        assert lookup_sync(with_password(server.address), "t") == []
        assert lookup_sync(server.address, "t", auth_secret=SECRET) == []
        assert server.headers(0)["authorization"].startswith("Basic ")
        assert server.headers(1)["authorization"] == f"Bearer {SECRET}"


def test_a_secret_that_cannot_be_a_header_is_refused_without_showing_it():
    with pytest.raises(ConfigError) as raised:
        NsqdClient("127.0.0.1:4151", auth_secret=SECRET + "\r\nX-Evil: 1")
    assert "line break" in str(raised.value)
    assert_no_secret(raised.value)


# -- what is shown ----------------------------------------------------------------------


def test_errors_and_reprs_of_the_clients_show_no_password():
    down = with_password(f"127.0.0.1:{free_port()}")
    client = NsqdClient(down, timeout=2, auth_secret=SECRET)
    with pytest.raises(NSQError) as raised:
        client.ping()
    assert_no_secret(raised.value, repr(client), client.address, vars(client).get("address"))
    for bad in (f"http://op:{PASSWORD}@h:99999", f"ftp://op:{PASSWORD}@h:1",
                f"op:{PASSWORD}@h:4161:9"):
        with pytest.raises(InvalidAddressError) as raised:
            LookupdClient(bad)
        assert "op:***@" in str(raised.value) or "not a valid address" in str(raised.value)
        assert_no_secret(raised.value)
    with pytest.raises(NSQError) as raised:
        lookup_sync(down, "t", timeout=2)
    assert_no_secret(raised.value)
    result = delete_channel("t", "c", lookupd_http_addresses=[down], timeout=2)
    assert not result.ok
    assert_no_secret(result)


def test_a_reader_shows_no_password_nor_secret_in_addresses_stats_repr_or_logs(caplog):
    down = with_password(f"127.0.0.1:{free_port()}")
    with caplog.at_level(logging.DEBUG):
        with HostileHttp("answer", b"not json") as garbage:
            reader = Reader("t", "c", lookupd_http_addresses=[down],
                            connection_factory=FakeConnections(), auth_secret=SECRET,
                            lookupd_request_timeout=1, lookupd_poll_interval=0.2)
            try:
                reader.get_batch(timeout=0.1)
                reader.connect_to_lookupd(with_password(garbage.address))
                wait_until(lambda: len(reader.stats()["lookupd"]["failing"]) == 2, 20,
                           "both lookupds failing")
                shown = [repr(reader), reader.lookupd_http_addresses, reader.stats()]
                with pytest.raises(NSQError) as raised:
                    reader.disconnect_from_lookupd(f"http://op:{PASSWORD}@h:1")
                shown.append(raised.value)
                reader.disconnect_from_lookupd(with_password(garbage.address))
            finally:
                reader.close()
            assert garbage.headers()["authorization"].startswith("Basic ")
    assert list(shown[1]) == [down.replace(f"op:{PASSWORD}@", ""),
                              f"http://{garbage.address}"]
    assert_no_secret(*shown, *(r.getMessage() for r in caplog.records),
                     *(str(r.args) for r in caplog.records))
    assert any("lookupd" in r.getMessage() and "skipped" in r.getMessage()
               for r in caplog.records)   # the failures were logged, without secrets


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.BytesIO(), io.StringIO()
    rc = cli.main(list(argv), stdout=out, stderr=err)
    return rc, out.getvalue().decode(), err.getvalue()


@pytest.mark.parametrize("argv", [
    ["stat", "--lookupd-http-address", "DOWN", "--count", "1"],
    ["stat", "--nsqd-http-address", "DOWN", "--count", "1"],
    ["stat", "--nsqd-http-address", "GARBAGE", "--count", "1"],
    ["topic", "pause", "--topic", "t", "--nsqd-http-address", "DOWN"],
    ["topic", "delete", "--topic", "t", "--lookupd-http-address", "DOWN"],
    ["channel", "delete", "--topic", "t", "--channel", "c", "--nsqd-http-address", "DOWN"],
    ["channel", "empty", "--topic", "t", "--channel", "c", "--lookupd-http-address",
     "GARBAGE"],
    ["stat", "--nsqd-http-address", f"http://op:{PASSWORD}@h:99999"],   # usage: exit 2
    ["stat", "--lookupd-http-address", f"op:{PASSWORD}@h"],
])
def test_the_admin_commands_show_no_password(argv, capsys):
    down = with_password(f"127.0.0.1:{free_port()}")
    with HostileHttp("answer", b"<html>") as garbage:
        argv = [a.replace("DOWN", down).replace("GARBAGE", with_password(garbage.address))
                for a in argv]
        rc, out, err = run(*argv, "--http-client-request-timeout", "2s")
    assert rc in (cli.EXIT_ERROR, cli.EXIT_USAGE) and err
    assert_no_secret(out, err, capsys.readouterr())
    assert "op:***@" in err or "127.0.0.1:" in err


def test_a_drip_fed_lookupd_with_a_password_times_out_naming_it_without_the_password():
    with HostileHttp("drip", b'{"producers": []}', every=0.5) as drip:
        started = time.monotonic()
        rc, out, err = run("stat", "--lookupd-http-address", with_password(drip.address),
                           "--count", "1", "--http-client-request-timeout", "1s")
        assert time.monotonic() - started < 10
    assert rc == cli.EXIT_ERROR and drip.address in err and "deadline of 1 s" in err
    assert_no_secret(out, err)
