"""Fixtures shared by the whole suite."""

import socket

import pytest

from tests.support.server import ServerProcess


@pytest.fixture
def server_factory(tmp_path):
    """Return a function that starts broker processes; all are stopped at teardown."""
    started = []

    def start(name="broker", **kw):
        s = ServerProcess(tmp_path / name, **kw)
        started.append(s)
        return s.start()

    yield start
    for s in started:
        try:
            s.stop()
        finally:
            s.close()


@pytest.fixture
def server(server_factory):
    """A running broker with defaults (flush level 1) on an ephemeral smss port."""
    return server_factory()


@pytest.fixture
def used_port():
    """A loopback port some other socket is listening on (binding it must fail)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    yield s.getsockname()[1]
    s.close()


@pytest.fixture
def etcd_server(tmp_path):
    """A running single-node etcd on loopback (tests/support/etcd.py); the test skips
    when there is no etcd binary."""
    from tests.support.etcd import SKIP_REASON, EtcdProcess, etcd_binary

    if etcd_binary() is None:
        pytest.skip(SKIP_REASON)
    etcd = EtcdProcess(tmp_path / "etcd")
    try:
        yield etcd.start()
    finally:
        etcd.stop()
