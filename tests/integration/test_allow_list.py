"""security.allow on the real server: a peer outside the list is refused at
accept on every door (TLS ones too) and logged once; a peer inside it is served."""

import socket

import pytest

from protocols.smss.client import SmssClient
from tests.support.nsq import http
from tests.support.server import ServerProcess
from tests.support.tls import Certs

L = "tcp:0:interface=127.0.0.1"


def closed_at_once(port):
    """True when the server closes a new connection without a byte (refused at accept)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        try:
            s.sendall(b"  V2NOP\n")
            return s.recv(100) == b""
        except ConnectionResetError:
            return True


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return Certs(tmp_path_factory.mktemp("allowcerts"))


def test_peers_outside_the_list_are_refused_on_every_door(tmp_path, certs):
    s = ServerProcess(tmp_path / "data", config={"security": {"allow": ["10.0.0.0/8", "::1/128"]}},
                      listen={"smss": L, "broker": L, "namesrv": L, "nsqd_tcp": certs.endpoint(),
                              "nsqd_http": L, "lookupd_tcp": L, "lookupd_http": L}).start()
    try:
        for name, port in s.ports.items():
            for _ in range(3):
                assert closed_at_once(port), name
        log = s.current_log()
        for door in ("smss", "broker", "namesrv", "nsqd_tcp", "nsqd_http", "lookupd_tcp", "lookupd_http"):
            line = f"refused a connection to {door} from 127.0.0.1 (not in security.allow)"
            # once per address per minute: the first door's three tries log once, and the
            # other doors' refusals of the same address within the minute log nothing
            assert log.count(line) <= 1
        assert log.count("from 127.0.0.1 (not in security.allow)") == 1
    finally:
        s.stop()
        s.close()


def test_peers_inside_the_list_are_served(tmp_path):
    s = ServerProcess(tmp_path / "data", config={"security": {"allow": ["127.0.0.0/8"]}},
                      listen={"smss": L, "nsqd_http": L}).start()
    try:
        with SmssClient("127.0.0.1", s.smss_port) as c:
            c.create("allowed")
        assert http(s.ports["NsqdHttpSite"], "GET", "/ping")[::2] == (200, b"OK")
        assert "security.allow" not in s.current_log()
    finally:
        s.stop()
        s.close()
