"""The checked adapter between the fast paths and Twisted's internals.

A Twisted release without one of the private attributes SpinningEPollReactor or send_now
read is simulated by deleting that attribute from the real Twisted class or module
(monkeypatch, undone after each test): the broker must then log one warning and use
Twisted's standard epoll reactor and plain transport.write.
"""

import socket
import threading

import pytest
from twisted.internet import _newtls, abstract, posixbase, protocol
from twisted.internet.epollreactor import EPollReactor
from twisted.logger import LogLevel, globalLogPublisher

from mqserver.runtime import fastpath, output
from mqserver.runtime.reactor import SpinningEPollReactor
from mqserver.runtime.output import send_now


@pytest.fixture(autouse=True)
def restore_send_now():
    before = output._SUPPORTED
    yield
    output.enable(before)


@pytest.fixture
def warnings():
    seen = []

    def observe(event):
        if event.get("log_namespace") == "mqserver.runtime.fastpath" and event["log_level"] >= LogLevel.warn:
            seen.append(event)

    globalLogPublisher.addObserver(observe)
    yield seen
    globalLogPublisher.removeObserver(observe)


def test_this_twisted_has_every_internal_the_fast_paths_read(warnings):
    choice = fastpath.choose(0.0002)
    assert choice.missing == []
    assert type(choice.reactor) is SpinningEPollReactor
    assert choice.spinning and choice.send_now and output._SUPPORTED
    assert choice.describe() == "fast paths in use: SpinningEPollReactor and send_now"
    assert warnings == []


@pytest.mark.parametrize("owner, name, shown", [
    (posixbase._PollLikeMixin, "_doReadOrWrite", "SpinningEPollReactor._doReadOrWrite"),
    (posixbase, "_NO_FILEDESC", "twisted.internet.posixbase._NO_FILEDESC"),
    (abstract.FileDescriptor, "_writeDisconnected", "tcp.Connection._writeDisconnected"),
    (abstract.FileDescriptor, "dataBuffer", "tcp.Connection.dataBuffer"),
    (_newtls.ConnectionMixin, "TLS", "tcp.Connection.TLS"),
])
def test_a_missing_internal_means_one_warning_and_the_standard_paths(
        monkeypatch, warnings, owner, name, shown):
    monkeypatch.delattr(owner, name)
    choice = fastpath.choose(0.0002)
    assert choice.missing == [shown]
    assert type(choice.reactor) is EPollReactor  # Twisted's own, not our subclass
    assert not choice.spinning and not choice.send_now and not output._SUPPORTED
    assert len(warnings) == 1
    text = warnings[0]["log_format"].format(**warnings[0])
    assert shown in text and "standard epoll reactor and transport.write" in text
    assert choice.describe().startswith("standard Twisted paths in use")


def test_the_operator_can_choose_the_standard_paths(warnings):
    choice = fastpath.choose(0.0002, standard=True)
    assert type(choice.reactor) is EPollReactor
    assert not choice.send_now and not output._SUPPORTED
    assert choice.describe() == ("standard Twisted paths in use (epoll reactor, "
                                 "transport.write): server.reactor is standard")
    assert warnings == []


class _Probe(protocol.Protocol):
    """Answers the first read with send_now and notes whether the bytes left at once
    (send_now) or were left queued for the reactor (transport.write)."""

    def dataReceived(self, data):
        send_now(self.transport, data)
        self.factory.queued.append(bool(self.transport._tempDataBuffer or self.transport.dataBuffer))
        self.transport.loseConnection()


@pytest.mark.parametrize("fast", [True, False])
def test_send_now_writes_directly_only_on_the_fast_path(fast):
    output.enable(fast)
    reactor = EPollReactor()
    factory = protocol.Factory.forProtocol(_Probe)
    factory.queued = []
    port = reactor.listenTCP(0, factory, interface="127.0.0.1")
    got = []

    def client():
        with socket.create_connection(("127.0.0.1", port.getHost().port), timeout=10) as s:
            s.sendall(b"ping")
            got.append(s.recv(10))
        reactor.callFromThread(reactor.stop)

    t = threading.Thread(target=client, daemon=True)
    t.start()
    guard = reactor.callLater(20, reactor.stop)
    reactor.run(installSignalHandlers=False)
    if guard.active():
        guard.cancel()
    t.join(10)
    port.stopListening()
    assert got == [b"ping"]
    assert factory.queued == [not fast]
