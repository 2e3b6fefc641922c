"""The test support's port picker: a port is only probed (bound, then closed), so the
kernel may hand the same one out twice in a row; free_port must not (a replica-group
member was once given one port for two of its doors and could not start)."""

from tests.support import etcd


class Probe:
    """A socket whose bind(0) gets the next of C{ports}, as the kernel chose them."""

    def __init__(self, ports):
        self._ports = ports

    def __call__(self, *args):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def bind(self, address):
        self._port = self._ports.pop(0)

    def getsockname(self):
        return ("127.0.0.1", self._port)


def test_free_port_never_hands_out_a_port_twice(monkeypatch):
    monkeypatch.setattr(etcd, "_GIVEN", set(), raising=False)
    monkeypatch.setattr(etcd.socket, "socket", Probe([41000, 41000, 41000, 41001]))
    assert [etcd.free_port(), etcd.free_port()] == [41000, 41001]


def test_free_ports_are_really_free_and_distinct():
    ports = [etcd.free_port() for _ in range(50)]
    assert len(set(ports)) == 50
