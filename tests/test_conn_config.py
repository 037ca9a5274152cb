"""ConnectionConfig: pynsq option names, validation, IDENTIFY payload, TLS context."""

from __future__ import annotations

import ssl

from hypothesis import given
from hypothesis import strategies as st

import pytest

from nsq_spark.config import ConnectionConfig
from nsq_spark.errors import ConfigError, TLSError

pytestmark = pytest.mark.unit


def test_pynsq_names_and_aliases() -> None:
    cfg = ConnectionConfig.from_options(
        timeout=2.5, heartbeat_interval=10, tls_v1=True, tls_options={"ca_certs": "/x"},
        snappy=True, user_agent="me/1", output_buffer_size=4096, output_buffer_timeout=50,
        sample_rate=10, auth_secret="hunter2-secret", msg_timeout=5, hostname="h.example", requeue_delay=30)
    assert cfg.connect_timeout == 2.5 and cfg.requeue_delay == 30
    payload = cfg.identify_payload()
    assert payload == {
        "client_id": payload["client_id"], "hostname": "h.example", "user_agent": "me/1",
        "feature_negotiation": True, "heartbeat_interval": 10000, "tls_v1": True,
        "snappy": True, "deflate": False, "sample_rate": 10, "output_buffer_size": 4096,
        "output_buffer_timeout": 50, "msg_timeout": 5000}
    assert "hunter2-secret" not in repr(cfg)  # never in logs
    assert cfg.replace(timeout=1.0).connect_timeout == 1.0


def test_deflate_level_only_sent_with_deflate() -> None:
    assert "deflate_level" not in ConnectionConfig().identify_payload()
    assert ConnectionConfig(deflate=True, deflate_level=3).identify_payload()["deflate_level"] == 3


@pytest.mark.parametrize("opts,match", [
    ({"heartbeat_intervall": 1}, "did you mean 'heartbeat_interval'"),
    ({"heartbeat_interval": 0.5}, "heartbeat_interval"),
    ({"heartbeat_interval": 61}, "heartbeat_interval"),
    ({"heartbeat_interval": 30000}, r"did you give milliseconds\? .*heartbeat_interval=30"),
    ({"heartbeat_interval": "5"}, "heartbeat_interval"),
    ({"deflate_level": 0}, "deflate_level"),
    ({"sample_rate": 100}, "sample_rate"),
    ({"snappy": True, "deflate": True}, "snappy and deflate"),
    ({"msg_timeout": 0.5}, "msg_timeout is in seconds"),
    ({"msg_timeout": "60"}, "msg_timeout"),
    ({"requeue_delay": -1}, "requeue_delay is in seconds"),
    ({"output_buffer_timeout": -5}, "output_buffer_timeout"),
    ({"timeout": 0}, "connect_timeout"),
    ({"tls_options": "yes"}, "tls_options"),
])
def test_invalid_options_are_config_errors(opts: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ConnectionConfig.from_options(**opts)


@pytest.mark.parametrize("opts,payload", [
    ({"heartbeat_interval": 5}, {"heartbeat_interval": 5000}),       # pynsq: seconds
    ({"heartbeat_interval": 1.5}, {"heartbeat_interval": 1500}),
    ({"heartbeat_interval": 60}, {"heartbeat_interval": 60000}),
    ({"msg_timeout": 1}, {"msg_timeout": 1000}),
    ({"msg_timeout": 2.5}, {"msg_timeout": 2500}),
    ({"msg_timeout": 900}, {"msg_timeout": 900000}),
    ({"output_buffer_timeout": 250}, {"output_buffer_timeout": 250}),  # pynsq: ms
])
def test_pynsq_units_seconds_sent_as_milliseconds(opts: dict, payload: dict) -> None:
    sent = ConnectionConfig.from_options(**opts).identify_payload()
    assert {k: sent[k] for k in payload} == payload


def test_defaults_in_seconds() -> None:
    cfg = ConnectionConfig()
    assert cfg.heartbeat_interval == 30 and cfg.heartbeat_interval_ms == 30000
    assert cfg.msg_timeout is None and cfg.msg_timeout_ms is None
    assert "msg_timeout" not in cfg.identify_payload()
    assert cfg.requeue_delay == 90


def test_heartbeats_can_be_disabled() -> None:
    assert ConnectionConfig(heartbeat_interval=-1).identify_payload()["heartbeat_interval"] == -1


def test_ssl_context_verification_on_by_default_and_switchable() -> None:
    ctx = ConnectionConfig(tls_v1=True).ssl_context()
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    off = ConnectionConfig(tls_v1=True, tls_verify=False).ssl_context()
    assert off.verify_mode == ssl.CERT_NONE and not off.check_hostname
    pynsq_off = ConnectionConfig(tls_options={"cert_reqs": ssl.CERT_NONE}).ssl_context()
    assert pynsq_off.verify_mode == ssl.CERT_NONE
    no_host = ConnectionConfig(tls_check_hostname=False).ssl_context()
    assert no_host.verify_mode == ssl.CERT_REQUIRED and not no_host.check_hostname
    given = ssl.create_default_context()
    assert ConnectionConfig(tls_options=given).ssl_context() is given



def test_a_missing_or_bad_tls_file_is_told_with_its_option_and_path(tmp_path) -> None:
    """ssl names no file ("[Errno 2] No such file or directory"): the error does."""
    with pytest.raises(TLSError, match="tls_ca_file '/nonexistent/ca.pem' cannot be read: "
                       "No such file or directory"):
        ConnectionConfig(tls_ca_file="/nonexistent/ca.pem").ssl_context()
    with pytest.raises(TLSError, match="tls_key_file '/nonexistent/key.pem' cannot be read"):
        ConnectionConfig(tls_cert_file=__file__, tls_key_file="/nonexistent/key.pem"
                         ).ssl_context()
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("not a certificate")
    with pytest.raises(TLSError, match=f"tls_ca_file '{not_pem}' is not a PEM file"):
        ConnectionConfig(tls_ca_file=str(not_pem)).ssl_context()
    with pytest.raises(TLSError, match=f"tls_cert_file '{not_pem}' is not a client certificate"):
        ConnectionConfig(tls_cert_file=str(not_pem)).ssl_context()


# -- go-nsq's LocalAddr, TopologyZone, TopologyRegion ----------------------------------------

def test_topology_hints_are_sent_in_identify_only_when_set() -> None:
    plain = ConnectionConfig().identify_payload()
    assert "topology_zone" not in plain and "topology_region" not in plain
    zoned = ConnectionConfig.from_options(topology_zone="us-east-1a",
                                          topology_region="us-east-1").identify_payload()
    assert (zoned["topology_zone"], zoned["topology_region"]) == ("us-east-1a", "us-east-1")
    only_zone = ConnectionConfig(topology_zone="z").identify_payload()
    assert only_zone["topology_zone"] == "z" and "topology_region" not in only_zone


@pytest.mark.parametrize("opts,match", [
    ({"topology_zone": ""}, "topology_zone=''"),
    ({"topology_zone": "  "}, "topology_zone"),
    ({"topology_region": 5}, r"topology_region=5 \(int\)"),
    ({"topology_region": "r" * 256}, "topology_region is 256 characters long: give at most 255"),
    ({"topology_zon": "a"}, "did you mean 'topology_zone'"),
    ({"local_address": "127.0.0.2:4000"}, "without a port"),
    ({"local_address": "localhost"}, "local_address='localhost'"),
    ({"local_address": 2130706434}, "local_address"),
    ({"local_addr": "127.0.0.2"}, "did you mean 'local_address'"),
])
def test_go_nsq_connection_options_are_checked(opts: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ConnectionConfig.from_options(**opts)


@given(ip=st.ip_addresses())
def test_any_ip_address_is_a_local_address_and_never_an_identify_key(ip) -> None:
    for given_as in (str(ip), f"[{ip}]" if ip.version == 6 else str(ip)):
        cfg = ConnectionConfig(local_address=given_as)
        assert cfg.source_ip == str(ip)  # bound as the bare address
        assert "local_address" not in cfg.identify_payload()
    assert ConnectionConfig().source_ip is None
    assert ConnectionConfig().local_address_hint() == ""
