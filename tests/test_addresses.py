"""The one address rule (nsq_spark._addresses): what is accepted, and what each bad entry
is told."""

import pytest

from nsq_spark._addresses import (Address, parse_address, parse_address_list, parse_http_address,
                                 parse_http_address_list)
from nsq_spark.errors import ConfigError, InvalidAddressError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("text, expected", [
    ("127.0.0.1:4150", Address("127.0.0.1", 4150)),
    (" localhost:1 ", Address("localhost", 1)),
    ("nsqd-0.nsqd.svc_x:65535", Address("nsqd-0.nsqd.svc_x", 65535)),
    ("[::1]:4150", Address("::1", 4150)),
    ("[fe80::1%eth0]:4150", Address("fe80::1%eth0", 4150)),
])
def test_good_addresses_parse(text, expected):
    assert parse_address(text, "p") == expected


def test_str_puts_ipv6_brackets_back():
    assert str(parse_address("[::1]:4150")) == "[::1]:4150"
    assert str(parse_address("h:1")) == "h:1"


@pytest.mark.parametrize("text, why", [
    ("127.0.0.1:4150:9", "more than one ':'"),
    ("http://127.0.0.1:4150", "URL"),
    ("a:1,b:2", "more than one ':'"),
    ("127.0.0.1", "no port"),
    (":4150", "empty host"),
    ("h:0", "outside 1-65535"),
    ("h:65536", "outside 1-65535"),
    ("h:-1", "not a number"),
    ("h:abc", "not a number"),
    ("::1:4150", "brackets"),
    ("[::1]", "IPv6"),
    ("a b:1", "bad host"),
    ("", "empty"),
    (4150, "expected a string"),
])
def test_bad_addresses_name_the_parameter_and_the_entry(text, why):
    with pytest.raises(InvalidAddressError) as e:
        parse_address(text, "nsqd_tcp_addresses")
    assert "nsqd_tcp_addresses" in str(e.value) and why in str(e.value)
    assert isinstance(e.value, ConfigError) and isinstance(e.value, ValueError)


def test_lists_from_strings_and_sequences_keep_order_and_drop_repeats():
    assert parse_address_list("a:1, b:2,,a:1", "p") == [Address("a", 1), Address("b", 2)]
    assert parse_address_list(["[::1]:3"], "p") == [Address("::1", 3)]
    assert parse_address_list(None, "p") == []
    with pytest.raises(InvalidAddressError, match="p: expected a list"):
        parse_address_list(4150, "p")


def test_http_addresses_accept_urls():
    assert parse_http_address("127.0.0.1:4161") == ("http", Address("127.0.0.1", 4161), "")
    assert parse_http_address("https://h:4161/base/") == ("https", Address("h", 4161), "/base")
    with pytest.raises(InvalidAddressError, match="scheme 'ftp'"):
        parse_http_address("ftp://h:1")


def test_http_addresses_accept_a_path_without_a_scheme_like_pynsq():
    assert parse_http_address("h:4161/lookup") == ("http", Address("h", 4161), "/lookup")
    with pytest.raises(InvalidAddressError, match="more than one ':'"):
        parse_http_address("h:4161:1/lookup")


def test_http_address_lists_are_checked_and_kept_as_given():
    assert parse_http_address_list(" https://h:1/base/, h:2,h:2") == ["https://h:1/base/", "h:2"]
    assert parse_http_address_list(None) == []
    with pytest.raises(InvalidAddressError, match="lookupd_http_addresses: '127.0.0.1:-1'"):
        parse_http_address_list(["h:1", "127.0.0.1:-1"])
    with pytest.raises(InvalidAddressError, match="lookupd_http_addresses: 4161"):
        parse_http_address_list([4161])


@pytest.mark.parametrize("text,bare", [
    ("127.0.0.2", "127.0.0.2"), ("::1", "::1"), ("[::1]", "::1"), ("[127.0.0.1]", "127.0.0.1"),
    ("[::1", None), ("::1]", None), ("[[::1]]", None), ("localhost", None), ("[]", None),
    ("127.0.0.2:4000", None), ("", None), (2130706434, None),
])
def test_ip_literal_is_the_one_rule_for_a_bare_ip(text, bare):
    from nsq_spark._addresses import ip_literal
    assert ip_literal(text) == bare


def test_an_unmatched_bracket_is_no_local_address():
    from nsq_spark.config import ConnectionConfig
    with pytest.raises(ConfigError, match=r"local_address='\[::1'"):
        ConnectionConfig(local_address="[::1")
    assert ConnectionConfig(local_address="[::1]").source_ip == "::1"
