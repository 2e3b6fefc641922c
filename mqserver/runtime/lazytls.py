"""Load the TLS stack (pyOpenSSL, cryptography) at its first use, not with the reactor.

Twisted's reactor modules import it whenever it is installed (C{twisted[tls]}):
C{posixbase} imports C{twisted.protocols.tls} and C{twisted.internet.ssl} for
C{listenSSL}/C{connectSSL}, and C{tcp} imports C{twisted.internet._newtls} (C{startTLS}),
which imports C{twisted.protocols.tls}, which imports OpenSSL. That is about 12 MB of
resident memory that a broker without TLS never uses.

L{defer_tls_import} imports C{twisted.internet.posixbase} (and so C{tcp} and C{_newtls})
while those two modules are stand-ins in C{sys.modules}; the stand-ins leave
C{sys.modules} right after. A stand-in's attribute is a function that imports the real
module at its first call (C{TLSMemoryBIOFactory(...)} from C{startTLS} or
C{listenSSL}), so TLS works as before, the stack loading when it is first asked for;
every other import of those modules (endpoints, C{ssl:} descriptions, our TLS code) gets
the real module.

This depends on how Twisted's reactor modules import TLS, so it is checked: when the
reactor modules are already imported, or when after the import the stand-ins are not
where this expects them, the real modules are put where Twisted's own import puts them
(loading the stack, the fallback) and L{defer_tls_import} returns C{False}.
"""

import importlib
import importlib.util
import sys
import types

__all__ = ["defer_tls_import"]

_TLS = "twisted.protocols.tls"
_SSL = "twisted.internet.ssl"
_REACTOR_MODULES = ("twisted.internet.posixbase", "twisted.internet.tcp",
                    "twisted.internet._newtls", _TLS, _SSL)


class _StandIn(types.ModuleType):
    """Stands for the module of the same name until one of its attributes is called."""

    def __getattr__(self, name):
        if name.startswith("__"):  # the import system probes __path__, __spec__, ...
            raise AttributeError(name)
        module = self.__name__

        def first_use(*args, **kwargs):
            return getattr(importlib.import_module(module), name)(*args, **kwargs)

        first_use.__name__ = first_use.__qualname__ = name
        return first_use


def _uninstall(parents):
    for name in (_TLS, _SSL):
        if isinstance(sys.modules.get(name), _StandIn):
            del sys.modules[name]
        package, _, leaf = name.rpartition(".")
        if isinstance(getattr(parents.get(package), leaf, None), _StandIn):
            delattr(parents[package], leaf)


def defer_tls_import():
    """Import Twisted's reactor modules without the TLS stack; C{True} if it worked."""
    if any(name in sys.modules for name in _REACTOR_MODULES):
        return False  # too late: someone imported them already
    if importlib.util.find_spec("OpenSSL") is None:
        return False  # no TLS stack to defer: Twisted's import is as lean already
    import twisted.internet
    import twisted.protocols

    parents = {"twisted.internet": twisted.internet, "twisted.protocols": twisted.protocols}
    sys.modules[_TLS], sys.modules[_SSL] = _StandIn(_TLS), _StandIn(_SSL)
    try:
        from twisted.internet import _newtls, posixbase
    finally:
        _uninstall(parents)
    if (isinstance(posixbase.tls, _StandIn) and isinstance(posixbase.ssl, _StandIn)
            and getattr(_newtls.TLSMemoryBIOFactory, "__name__", "") == "TLSMemoryBIOFactory"
            and not isinstance(_newtls.TLSMemoryBIOFactory, type)):
        return True
    _restore(posixbase, _newtls)
    return False


def _restore(posixbase, newtls):
    """Put the real modules where Twisted's own import would have: the fallback."""
    tls, ssl = importlib.import_module(_TLS), importlib.import_module(_SSL)
    posixbase.tls, posixbase.ssl = tls, ssl
    newtls.TLSMemoryBIOFactory = tls.TLSMemoryBIOFactory
