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


def test_broker_start_leaves_the_tls_stack_unloaded():
    """Building the broker with plain TCP doors (smss, nsqd, and the RocketMQ broker
    with its nameserver in the same process: what twistd mqserver does at start) imports
    neither pyOpenSSL/cryptography nor twisted.internet.endpoints (which imports
    them): about 12 MB resident an idle broker without TLS does not use."""
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
        "loaded = [m for m in ('OpenSSL', 'cryptography', 'service_identity',\n"
        "          'twisted.protocols.tls', 'twisted.internet.ssl',\n"
        "          'twisted.internet.endpoints') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )


def test_deferred_tls_stack_loads_at_first_start_tls():
    """After L{mqserver.runtime.lazytls.defer_tls_import} the reactor's TCP connections can still
    start TLS: a server listening with listenSSL and a client doing startTLS on a plain
    connection complete a TLS exchange over loopback (both go through the stand-ins:
    C{posixbase.tls} and C{_newtls.TLSMemoryBIOFactory})."""
    _run(
        "import sys\n"
        "from mqserver.runtime.lazytls import defer_tls_import\n"
        "assert defer_tls_import()\n"
        "assert 'OpenSSL' not in sys.modules\n"
        "from twisted.internet import reactor, protocol, tcp, interfaces\n"
        "assert interfaces.ITLSTransport.implementedBy(tcp.Server)\n"
        "assert 'OpenSSL' not in sys.modules\n"
        "from twisted.internet import ssl\n"
        "from tests.support.tls import Certs\n"
        "import tempfile\n"
        "certs = Certs(tempfile.mkdtemp())\n"
        "pem = lambda p: open(p, 'rb').read()\n"
        "server_options = ssl.PrivateCertificate.loadPEM(pem(certs.cert) + pem(certs.key)).options()\n"
        "client_options = ssl.optionsForClientTLS('localhost', ssl.Certificate.loadPEM(pem(certs.ca)))\n"
        "got = []\n"
        "class Echo(protocol.Protocol):\n"
        "    def dataReceived(self, data):\n"
        "        self.transport.write(data.upper())\n"
        "class Client(protocol.Protocol):\n"
        "    def connectionMade(self):\n"
        "        self.transport.startTLS(client_options)\n"
        "        self.transport.write(b'hello')\n"
        "    def dataReceived(self, data):\n"
        "        got.append(data)\n"
        "        reactor.stop()\n"
        "port = reactor.listenSSL(0, protocol.Factory.forProtocol(Echo),\n"
        "                         server_options, interface='127.0.0.1')\n"
        "protocol.ClientCreator(reactor, Client).connectTCP('127.0.0.1', port.getHost().port)\n"
        "reactor.callLater(20, reactor.stop)\n"
        "reactor.run()\n"
        "assert got == [b'HELLO'], got\n"
    )


def test_free_heap_released_after_start_on_glibc():
    """The broker returns the heap start-up freed (glibc's malloc_trim, reached through
    ctypes); elsewhere the call is a no-op that says so."""
    import platform

    from mqserver.service import release_free_heap

    assert release_free_heap() is (platform.libc_ver()[0] == "glibc")


def test_deferred_tls_fallback_puts_the_real_modules_back():
    """When the stand-ins are not where L{defer_tls_import} expects them (a Twisted
    release that imports TLS differently), its fallback binds the real modules where
    Twisted's own import would have."""
    _run(
        "import sys\n"
        "from mqserver.runtime import lazytls\n"
        "assert lazytls.defer_tls_import()\n"
        "from twisted.internet import _newtls, posixbase\n"
        "lazytls._restore(posixbase, _newtls)\n"
        "import twisted.protocols.tls as tls, twisted.internet.ssl as ssl\n"
        "assert posixbase.tls is tls and posixbase.ssl is ssl\n"
        "assert _newtls.TLSMemoryBIOFactory is tls.TLSMemoryBIOFactory\n"
        "assert not isinstance(sys.modules['twisted.protocols.tls'], lazytls._StandIn)\n"
    )


def test_msgout_door_loads_no_http_client_until_a_push():
    """A started msgout door without push subscriptions imports neither treq nor
    twisted.web.client (which import twisted.internet.endpoints and the TLS stack, about
    13 MB resident); its push manager makes the connection pool at the first push."""
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
        "loaded = [m for m in ('treq', 'twisted.web.client', 'twisted.internet.endpoints',\n"
        "          'OpenSSL', 'cryptography') if m in sys.modules]\n"
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
