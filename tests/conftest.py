"""Fixtures shared by the whole suite."""

import socket

import pytest

from tests.support.server import ServerProcess


def work_unit(nodeid):
    """The unit of work C{make test}'s parallel run (C{pytest -n N}) gives one worker:
    every Spark test (they share one JVM, L{tests.spark.conftest}), else a test's file
    (its module fixtures, a broker or the ports the docs name, are set up once)."""
    path = nodeid.split("::", 1)[0]
    return "tests/spark" if path.startswith("tests/spark/") else path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Hand out L{work_unit}s, in the order collected (the Spark tests first)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return work_unit(nodeid)

    # in collection order, not largest unit first: the Spark unit, the longest by far,
    # must start at once (pytest_collection_modifyitems puts it first)
    config.option.loadscopereorder = False
    return ByWorkUnit(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    # Under pytest-xdist (a worker has workerinput), the Spark tests first: see
    # pytest_xdist_make_scheduler. A plain run keeps the order of the files.
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: work_unit(item.nodeid) != "tests/spark")


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
