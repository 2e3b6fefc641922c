"""The service tree in-process: start-up order, all-or-nothing start, ports told to
factories, background loops as services."""

import os

import pytest
import pytest_twisted
from twisted.internet.protocol import Factory
from twisted.logger import formatEvent, globalLogPublisher

from mqserver.frontdoor import front_doors
from mqserver.service import ListenerService
from mqserver.store.lock import DirectoryLock, DirectoryLocked
from mqserver.tap import Options, makeService


def options(tmp_path, **listen):
    o = Options()
    args = ["--data", str(tmp_path / "data")]
    for door in front_doors():
        args += ["--listen", f"{door}={listen.get(door, 'off')}"]
    o.parseOptions(args)
    return o


@pytest.fixture
def critical():
    """Lines logged at level critical while the test runs."""
    lines = []

    def observe(event):
        if event.get("log_level") is not None and event["log_level"].name == "critical":
            lines.append(formatEvent(event))

    globalLogPublisher.addObserver(observe)
    yield lines
    globalLogPublisher.removeObserver(observe)


def test_a_door_failing_after_the_store_opened_closes_the_store(tmp_path, critical):
    """Started without privilegedStartService (as twist does), the listener binds after
    the store opened; its failure stops the process and the store is closed cleanly:
    checkpoint written, lock released. (The port is taken after the options were
    checked, which would have refused it.)"""
    import socket

    from twisted.internet import reactor

    with socket.socket() as taker:
        taker.bind(("127.0.0.1", 0))
        desc = f"tcp:{taker.getsockname()[1]}:interface=127.0.0.1"
    opts = options(tmp_path, smss=desc)
    with socket.socket() as taker:
        taker.bind(("127.0.0.1", int(desc.split(":")[1])))
        taker.listen(1)
        root = makeService(opts, reactor)
        with pytest.raises(SystemExit) as exit_info:
            root.startService()
    assert exit_info.value.code == 1
    assert critical == [f"mqserver cannot start: front door smss cannot listen on {desc}: "
                        "[Errno 98] Address already in use"]
    store = root.storage.store
    assert not store.opened
    assert os.path.exists(os.path.join(store.path, "metadata.json"))
    lock = DirectoryLock(store.path)
    lock.acquire()  # released by the refused broker
    lock.release()


def test_a_locked_directory_stops_start_up_before_anything_is_written(tmp_path, critical):
    from twisted.internet import reactor

    root = makeService(options(tmp_path), reactor)
    path = root.storage.store.path
    os.makedirs(path)
    holder = DirectoryLock(path)
    holder.acquire()
    try:
        with pytest.raises(SystemExit):
            root.startService()
        with pytest.raises(DirectoryLocked) as again:
            DirectoryLock(path).acquire()
    finally:
        holder.release()
    assert sorted(os.listdir(path)) == ["lock"]
    assert again.value.pid == os.getpid()
    assert critical == [f"mqserver cannot start: data directory {path} is in use by process "
                        f"{os.getpid()} (lock file {path}/lock); one broker per data directory"]


class Told(Factory):
    """A factory recording when it learns its port."""

    def __init__(self, storage):
        self.storage = storage
        self.told = []

    def listening(self, port):
        self.told.append((port.getHost().port, self.storage.store.opened))


@pytest_twisted.inlineCallbacks
def test_listeners_bind_privileged_and_learn_their_port_once_the_store_is_open(tmp_path):
    from twisted.internet import reactor

    root = makeService(options(tmp_path), reactor)
    root.config.listen["smss"] = "tcp:0:interface=127.0.0.1"
    factory = Told(root.storage)
    listener = root.add_listener("smss", factory)
    assert isinstance(listener, ListenerService)
    root.privilegedStartService()
    try:
        assert listener.port is not None and factory.told == []  # bound, not yet told
        assert not root.storage.store.opened
        root.startService()
        assert factory.told == [(listener.port.getHost().port, True)]
    finally:
        yield root.stopService()
    assert listener.port is None and not root.storage.store.opened


@pytest_twisted.inlineCallbacks
def test_background_loops_are_services_stopped_before_the_store_closes(tmp_path):
    from twisted.internet import reactor

    root = makeService(options(tmp_path, broker="tcp:0:interface=127.0.0.1"), reactor)
    names = [s.name for s in root]
    assert names.index("storage") < names.index("rocketmq-broker") < names.index("listen-broker")
    loops = [root.getServiceNamed(n) for n in ("rocketmq-tick", "rocketmq-register",
                                               "rocketmq-expire-clients")]
    store_loops = list(root.storage)
    root.privilegedStartService()
    root.startService()
    assert all(s.running for s in loops + store_loops)
    door = root.getServiceNamed("listen-broker").factory
    assert door.broker_addr is not None  # told its port
    yield root.stopService()
    assert not any(s.running for s in loops + store_loops)
    assert not root.storage.store.opened


@pytest_twisted.inlineCallbacks
def test_msgout_pushes_are_a_service_started_after_the_broker(tmp_path):
    # they started on a timer the site armed when its listener started:
    # now the tree starts them after the broker and stops them after the listener
    from twisted.internet import reactor

    root = makeService(options(tmp_path, msgout="tcp:0:interface=127.0.0.1"), reactor)
    names = [s.name for s in root]
    assert names.index("storage") < names.index("msgout-pushes") < names.index("listen-msgout")
    queues = root.storage.broker.queues
    root.privilegedStartService()
    assert queues.push_runner is None  # the listener is bound, the broker not started
    root.startService()
    assert root.getServiceNamed("msgout-pushes").running
    assert queues.push_runner is not None  # pushing, without waiting for a reactor turn
    yield root.stopService()
    assert queues.push_runner is None


@pytest_twisted.inlineCallbacks
def test_start_up_names_each_door_then_says_ready_and_writes_the_ready_file(tmp_path):
    """Each listener logs its door and endpoint; once all listen and the store is open,
    one ready line lists them and --ready-file holds version, pid and bound addresses."""
    import json

    from twisted.internet import reactor

    from mqserver.version import version

    o = Options()
    args = ["--data", str(tmp_path / "data"), "--ready-file", str(tmp_path / "ready.json")]
    for door in front_doors():
        desc = {"smss": "tcp:0:interface=127.0.0.1",
                "console": f"unix:{tmp_path / 'c.sock'}"}.get(door, "off")
        args += ["--listen", f"{door}={desc}"]
    o.parseOptions(args)
    lines = []

    def observe(event):
        if event.get("log_format"):
            lines.append(formatEvent(event))

    globalLogPublisher.addObserver(observe)
    root = makeService(o, reactor)
    try:
        root.privilegedStartService()
        assert not os.path.exists(tmp_path / "ready.json")  # not before every door listens
        root.startService()
        port = root.getServiceNamed("listen-smss").port.getHost().port
        with open(tmp_path / "ready.json") as f:
            ready = json.load(f)
    finally:
        globalLogPublisher.removeObserver(observe)
        yield root.stopService()
    sock = str(tmp_path / "c.sock")
    assert ready == {"version": version(), "pid": os.getpid(), "doors": {
        "smss": {"host": "127.0.0.1", "port": port, "endpoint": "tcp:0:interface=127.0.0.1"},
        "console": {"path": sock, "endpoint": f"unix:{sock}"}}}
    assert (f"door smss listening on tcp:0:interface=127.0.0.1 (tcp:127.0.0.1:{port})"
            in lines)
    assert f"door console listening on unix:{sock} (unix:{sock})" in lines
    ready_line = f"mqserver {version()} ready: smss tcp:127.0.0.1:{port}, console unix:{sock}"
    assert ready_line in lines
    assert lines.index(ready_line) > lines.index(f"door console listening on unix:{sock} "
                                                 f"(unix:{sock})")
    assert os.listdir(tmp_path).count("ready.json") == 1
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


def test_a_store_path_that_cannot_be_used_at_start_is_one_critical_line(tmp_path, critical):
    """The options found the data directory usable, but at start (as another user under
    twistd --uid, or changed meanwhile) it is not: one line naming store.path, exit 1,
    no traceback."""
    from twisted.internet import reactor

    opts = options(tmp_path)
    (tmp_path / "data").write_text("now a file")
    root = makeService(opts, reactor)
    with pytest.raises(SystemExit) as exit_info:
        root.startService()
    assert exit_info.value.code == 1
    assert critical == [f"mqserver cannot start: store.path {tmp_path / 'data'} cannot be used: "
                        f"[Errno 17] File exists: '{tmp_path / 'data'}'"]
