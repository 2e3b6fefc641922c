"""What the broker loads before any client asks for it (its idle resident size,
bench/idle_rss.py)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(code):
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, PYTHONPATH=ROOT))
    assert done.returncode == 0, done.stderr


def test_cramjam_loaded_only_when_a_stream_needs_it():
    """The NSQ door does not load cramjam (about 1.5 MB resident) until a client
    negotiates snappy; then the codec works as before."""
    _run(
        "import sys\n"
        "import protocols.nsq.factory, protocols.nsq.protocol\n"
        "assert 'cramjam' not in sys.modules, 'cramjam loaded at import'\n"
        "from protocols.nsq.compress import SnappyCompressor, SnappyDecompressor\n"
        "data = SnappyCompressor().compress(b'abc' * 100)\n"
        "assert SnappyDecompressor().decompress(data) == b'abc' * 100\n"
        "assert 'cramjam' in sys.modules\n"
    )


def test_broker_start_with_plain_tcp_doors_leaves_endpoints_unloaded():
    """Building the broker with plain TCP doors (smss, nsqd, and the RocketMQ broker
    with its nameserver in the same process: what twistd mqserver does at start) does
    not import twisted.internet.endpoints: C{tcp:} descriptions are listened on with the
    reactor's C{listenTCP} (mqserver.listen), other descriptions import it when parsed."""
    _run(
        "import sys, tempfile\n"
        "from mqserver import tap\n"
        "d = tempfile.mkdtemp()\n"
        "o = tap.Options()\n"
        "from tests.support.server import _door_names\n"
        "plain = dict.fromkeys(('smss', 'nsqd_tcp', 'namesrv', 'broker'), 'tcp:0:interface=127.0.0.1')\n"
        "args = ['--data', d]\n"
        "for name in _door_names():\n"
        "    args += ['--listen', f'{name}={plain.get(name, \"off\")}']\n"
        "o.parseOptions(args)\n"
        "tap.makeService(o)\n"
        "assert 'twisted.internet.endpoints' not in sys.modules\n"
    )


def test_free_heap_released_after_start_on_glibc():
    """The broker returns the heap start-up freed (glibc's malloc_trim, reached through
    ctypes); elsewhere the call is a no-op that says so."""
    import platform

    from mqserver.service import release_free_heap

    assert release_free_heap() is (platform.libc_ver()[0] == "glibc")


def test_msgout_door_loads_no_http_client_until_a_push():
    """A started msgout door without push subscriptions imports neither treq nor
    twisted.web.client (which import twisted.internet.endpoints); its push manager makes
    the connection pool at the first push."""
    _run(
        "import sys, tempfile\n"
        "from mqserver import tap\n"
        "from tests.support.server import _door_names\n"
        "args = ['--data', tempfile.mkdtemp()]\n"
        "for name in _door_names():\n"
        "    args += ['--listen', f'{name}=' + ('tcp:0:interface=127.0.0.1' if name == 'msgout' else 'off')]\n"
        "o = tap.Options()\n"
        "o.parseOptions(args)\n"
        "svc = tap.makeService(o)\n"
        "svc.privilegedStartService()\n"
        "svc.startService()\n"
        "loaded = [m for m in ('treq', 'twisted.web.client', 'twisted.internet.endpoints')\n"
        "          if m in sys.modules]\n"
        "assert not loaded, loaded\n"
        "from protocols.msgout.push import PushManager\n"
        "from twisted.internet import reactor\n"
        "pushes = PushManager(None, reactor)\n"
        "pool = pushes.connection_pool()\n"
        "assert pushes.connection_pool() is pool and pool.maxPersistentPerHost == 4\n"
        "assert 'twisted.web.client' in sys.modules\n"
        "svc.stopService()\n"
    )


def test_http_doors_load_at_their_first_connection():
    """A started broker with every HTTP door listening (nsqd and lookupd HTTP, msgout,
    metrics, admin) has imported neither those doors' sites nor twisted.web.server nor
    prometheus_client (about 12 MB resident), yet what they do at start is done: the
    NSQ node knows its HTTP port, msgout's push service runs. The first connection to a
    door builds its site."""
    _run(
        "import sys, tempfile\n"
        "from mqserver import tap\n"
        "from twisted.internet.address import IPv4Address\n"
        "from tests.support.server import _door_names\n"
        "on = ('nsqd_http', 'lookupd_http', 'msgout', 'metrics', 'admin')\n"
        "args = ['--data', tempfile.mkdtemp()]\n"
        "for name in _door_names():\n"
        "    args += ['--listen', f'{name}=' + ('tcp:0:interface=127.0.0.1' if name in on else 'off')]\n"
        "o = tap.Options()\n"
        "o.parseOptions(args)\n"
        "svc = tap.makeService(o)\n"
        "svc.privilegedStartService()\n"
        "svc.startService()\n"
        "heavy = ('twisted.web.server', 'prometheus_client', 'protocols.metrics.door',\n"
        "         'protocols.admin.door', 'protocols.nsq.http', 'protocols.nsq.lookupd_http',\n"
        "         'protocols.msgout.http')\n"
        "loaded = [m for m in heavy if m in sys.modules]\n"
        "assert not loaded, loaded\n"
        "node = svc.storage.broker.extensions['nsq']\n"
        "http = svc.getServiceNamed('listen-nsqd_http')\n"
        "assert node.http_port == http.port.getHost().port and node.http_tls is False\n"
        "assert svc.getServiceNamed('msgout-pushes').running\n"
        "p = svc.getServiceNamed('listen-metrics').factory.buildProtocol(IPv4Address('TCP', '127.0.0.1', 1))\n"
        "assert type(svc.getServiceNamed('listen-metrics').factory.factory).__name__ == 'MetricsSite'\n"
        "assert 'prometheus_client' in sys.modules and 'protocols.admin.door' not in sys.modules\n"
        "svc.stopService()\n"
    )


def test_tls_stack_left_out_when_the_configuration_uses_no_tls():
    """A broker whose doors listen on plain TCP, as the twistd plugin builds it, runs as
    Twisted runs without pyOpenSSL: neither it nor cryptography is loaded, the fast paths
    still check out, and the doors start. With the msgout door (pushes may go to https://
    URLs) or C{server.tlsStack: always} the stack loads as Twisted loads it."""
    start = (
        "import sys, tempfile\n"
        "from mqserver import tap\n"
        "from tests.support.server import _door_names\n"
        "def start(on, *extra):\n"
        "    args = ['--data', tempfile.mkdtemp(), *extra]\n"
        "    for name in _door_names():\n"
        "        args += ['--listen', f'{name}=' + ('tcp:0:interface=127.0.0.1' if name in on else 'off')]\n"
        "    o = tap.Options()\n"
        "    o.parseOptions(args)\n"
        "    svc = tap.makeService(o)\n"
        "    svc.privilegedStartService()\n"
        "    svc.startService()\n"
        "    return o, svc\n"
    )
    _run(
        start +
        "o, svc = start(('smss', 'nsqd_tcp', 'namesrv', 'broker', 'console', 'metrics', 'admin'))\n"
        "assert not o['tls'].loaded, o['tls'].why\n"
        "assert sys.modules['OpenSSL'] is None\n"
        "loaded = [m for m in ('cryptography', 'twisted.internet.ssl', 'twisted.protocols.tls')\n"
        "          if m in sys.modules]\n"
        "assert not loaded, loaded\n"
        "from mqserver.runtime.fastpath import service_reactor\n"
        "assert service_reactor.choice.spinning and service_reactor.choice.send_now\n"
        "assert svc.getServiceNamed('listen-smss').running\n"
        "svc.stopService()\n"
    )
    for extra in ("o, svc = start(('smss', 'msgout'))",
                  "o, svc = start(('smss',), '--config', sys.argv[1])"):
        import tempfile

        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            f.write("server:\n  tlsStack: always\n")
        done = subprocess.run(
            [sys.executable, "-c", start + extra + "\n"
             "assert o['tls'].loaded, o['tls'].why\n"
             "import OpenSSL.SSL, twisted.internet.ssl\n"
             "svc.stopService()\n", f.name],
            cwd=ROOT, capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=ROOT))
        os.unlink(f.name)
        assert done.returncode == 0, done.stderr


def test_start_up_objects_are_frozen_once_the_broker_runs():
    """Once its reactor runs, the broker has collected start-up's garbage and moved what
    is left out of the collector's generations (gc.freeze): a cycle made before is gone,
    the objects made before are frozen, the ones made after are not."""
    _run(
        "import gc, os, sys, tempfile, traceback, weakref\n"
        "from mqserver import tap\n"
        "from tests.support.server import _door_names\n"
        "class Node: pass\n"
        "def check():\n"
        "    gc.disable()  # only the broker's own collection may find the cycle\n"
        "    a, b = Node(), Node()\n"
        "    a.b, b.a = b, a\n"
        "    gone = weakref.ref(a)\n"
        "    del a, b\n"
        "    args = ['--data', tempfile.mkdtemp()]\n"
        "    for name in _door_names():\n"
        "        args += ['--listen', f'{name}=' + ('tcp:0:interface=127.0.0.1' if name == 'smss' else 'off')]\n"
        "    o = tap.Options()\n"
        "    o.parseOptions(args)\n"
        "    svc = tap.makeService(o)\n"
        "    kept = Node()\n"
        "    from twisted.internet import reactor\n"
        "    svc.privilegedStartService()\n"
        "    svc.startService()\n"
        "    assert gc.get_freeze_count() == 0 and gone() is not None\n"
        "    reactor.callLater(0.05, reactor.stop)\n"
        "    reactor.run(installSignalHandlers=False)\n"
        "    assert gone() is None, 'a cycle made at start-up was frozen'\n"
        "    assert gc.get_freeze_count() > 10000, gc.get_freeze_count()\n"
        "    later = Node()\n"
        "    objects = gc.get_objects()\n"
        "    assert any(o is later for o in objects) and not any(o is kept for o in objects)\n"
        "try:\n"
        "    check()\n"
        "except BaseException:\n"
        "    traceback.print_exc()\n"
        "    sys.stderr.flush()\n"
        "    os._exit(1)\n"
        "os._exit(0)  # the store's disk threads would keep the process waiting\n"
    )
