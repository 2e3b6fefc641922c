"""mqserver.runtime.leanstart: modules twistd imports at start-up load at their first use
(python -m mqserver), and work as before when used. Each test runs in a fresh
interpreter, since deferring changes that process's sys.modules."""

import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(code, tmp_path=None):
    path = [ROOT] + ([str(tmp_path)] if tmp_path is not None else [])
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(path)))
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_broker_start_leaves_the_deferred_modules_unloaded():
    """twistd's imports and the broker's start (plain smss and nsqd doors) leave ssl,
    hashlib, hmac, http.cookiejar, asyncio.sslproto and pdb unrun: no urllib.request,
    email, _ssl or _hashlib, and no libcrypto mapped (about 7 MB resident)."""
    _run("""
        import sys, tempfile
        from mqserver.runtime.leanstart import DEFERRED, LazyModule, defer_imports
        assert defer_imports() == list(DEFERRED)
        import twisted.scripts.twistd
        from mqserver import tap
        from mqserver.frontdoor import front_doors
        plain = dict.fromkeys(('smss', 'nsqd_tcp'), 'tcp:0:interface=127.0.0.1')
        args = ['--data', tempfile.mkdtemp()]
        for name in front_doors():
            args += ['--listen', f'{name}={plain.get(name, "off")}']
        o = tap.Options()
        o.parseOptions(args)
        tap.makeService(o)
        ran = [m for m in DEFERRED if not isinstance(sys.modules[m], LazyModule)]
        assert not ran, ran
        loaded = [m for m in ('urllib.request', 'email', 'http.client', '_ssl', '_hashlib',
                              'bdb') if m in sys.modules]
        assert not loaded, loaded
        with open('/proc/self/maps') as f:
            assert 'libcrypto' not in f.read()
        """)


def test_deferred_modules_work_at_first_use():
    """Each deferred module runs at its first attribute lookup, in the very object its
    importers hold, and then is an ordinary module: hashes, HMAC, TLS contexts, cookie
    jars, asyncio's SSL protocol and pdb all work; ``from ... import`` works too."""
    _run("""
        import sys, types
        from mqserver.runtime.leanstart import LazyModule, defer_imports
        defer_imports()
        import asyncio, hashlib, hmac, pdb, ssl
        from http import cookiejar
        held = {m: sys.modules[m] for m in ('ssl', 'hashlib', 'hmac', 'http.cookiejar',
                                            'asyncio.sslproto', 'pdb')}
        assert all(isinstance(m, LazyModule) for m in held.values())
        assert asyncio.sslproto is held['asyncio.sslproto']
        assert hashlib.sha1(b'abc').hexdigest() == 'a9993e364706816aba3e25717850c26c9cd0d89d'
        assert hmac.compare_digest(b'x', b'x') and not hmac.compare_digest(b'x', b'y')
        mac = hmac.new(b'key', b'The quick brown fox jumps over the lazy dog', hashlib.sha256)
        assert mac.hexdigest() == (
            'f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8')
        from ssl import SSLContext, PROTOCOL_TLS_CLIENT
        assert isinstance(ssl.create_default_context(), SSLContext)
        assert asyncio.sslproto.ssl is ssl and asyncio.base_events.ssl is ssl
        assert asyncio.sslproto.SSLProtocol.__module__ == 'asyncio.sslproto'
        assert 'CookieJar' in dir(cookiejar)  # dir() runs the module too
        assert len(cookiejar.CookieJar()) == 0
        assert issubclass(pdb.Pdb, __import__('bdb').Bdb)
        for name, module in held.items():
            assert sys.modules[name] is module, name
            assert type(module) is types.ModuleType, name
        """)


def test_asyncio_tls_works_after_deferral():
    """asyncio imported its ssl as a stand-in; a TLS connection through asyncio over
    loopback still completes (the stand-in runs at asyncio's first use of it)."""
    _run("""
        from mqserver.runtime.leanstart import defer_imports
        defer_imports()
        import asyncio, ssl, tempfile
        from tests.support.tls import Certs
        certs = Certs(tempfile.mkdtemp())
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ctx.load_cert_chain(certs.cert, certs.key)
        client_ctx = ssl.create_default_context(cafile=certs.ca)

        async def main():
            async def echo(reader, writer):
                writer.write((await reader.readline()).upper())
                await writer.drain()
                writer.close()
            server = await asyncio.start_server(echo, '127.0.0.1', 0, ssl=server_ctx)
            port = server.sockets[0].getsockname()[1]
            reader, writer = await asyncio.open_connection(
                '127.0.0.1', port, ssl=client_ctx, server_hostname='localhost')
            writer.write(b'hello\\n')
            got = await reader.readline()
            writer.close()
            server.close()
            return got

        assert asyncio.run(asyncio.wait_for(main(), 20)) == b'HELLO\\n'
        """)


def test_modules_that_cannot_be_deferred_import_as_before():
    """The fallback: a module already imported, one not found, or one whose C extension
    is missing is left to the ordinary import (its importers' ``try: import`` sees the
    ImportError at import time, as without deferral)."""
    _run("""
        import sys, json
        from mqserver.runtime.leanstart import LazyModule, defer_imports
        got = defer_imports({'json': (), 'no_such_module_here': (),
                             'ssl': ('_no_such_extension_here',), 'pdb': ()})
        assert got == ['pdb'], got
        assert type(sys.modules['json']) is not LazyModule
        assert 'ssl' not in sys.modules and 'no_such_module_here' not in sys.modules
        try:
            import no_such_module_here
        except ImportError:
            pass
        else:
            raise AssertionError('imported a module that does not exist')
        """)


def test_a_module_failing_at_first_use_fails_as_its_import_would(tmp_path):
    """A deferred module whose code raises: the first use raises that error and the
    module leaves sys.modules (as a failed import does), so the next import runs it
    again."""
    (tmp_path / "lean_fails.py").write_text(
        "import builtins\n"
        "builtins.lean_runs = getattr(builtins, 'lean_runs', 0) + 1\n"
        "raise ImportError('lean_fails cannot load')\n"
        "value = 1\n")
    _run("""
        import builtins, sys
        from mqserver.runtime.leanstart import defer_imports
        assert defer_imports({'lean_fails': ()}) == ['lean_fails']
        import lean_fails
        try:
            lean_fails.value
        except ImportError as e:
            assert 'cannot load' in str(e)
        else:
            raise AssertionError('no error at first use')
        assert 'lean_fails' not in sys.modules and builtins.lean_runs == 1
        try:
            import lean_fails
        except ImportError:
            pass
        assert builtins.lean_runs == 2
        """, tmp_path)


def test_concurrent_first_uses_run_the_module_once(tmp_path):
    """Two threads using a deferred module at once: its code runs once, and both see
    its attributes (the second waits for the first to finish running it)."""
    (tmp_path / "lean_slow.py").write_text(
        "import builtins\n"
        "builtins.lean_runs = getattr(builtins, 'lean_runs', 0) + 1\n"
        "builtins.lean_started.set()\n"
        "builtins.lean_gate.wait(20)\n"
        "value = 42\n")
    _run("""
        import builtins, threading
        from mqserver.runtime.leanstart import defer_imports
        builtins.lean_started, builtins.lean_gate = threading.Event(), threading.Event()
        assert defer_imports({'lean_slow': ()}) == ['lean_slow']
        import lean_slow
        got = []
        first = threading.Thread(target=lambda: got.append(lean_slow.value))
        first.start()
        assert builtins.lean_started.wait(20)
        second = threading.Thread(target=lambda: got.append(lean_slow.value))
        second.start()
        builtins.lean_gate.set()
        first.join(20)
        second.join(20)
        assert got == [42, 42] and builtins.lean_runs == 1, (got, builtins.lean_runs)
        """, tmp_path)
