"""Load a few standard-library modules at their first use, not when twistd imports them.

Before any plugin code runs, C{twistd} imports modules an idle broker never uses:
C{twisted.python.compat} imports C{http.cookiejar} (and with it C{urllib.request},
C{http.client}, C{email} and C{hashlib}) for a deprecated alias, C{twisted.internet.defer}
imports asyncio, whose C{base_events}/C{sslproto} import C{ssl} (and C{_ssl}, libssl,
libcrypto), and C{twisted.application.app} imports C{pdb} for C{--debug}. That is about
7 MB of resident memory (`bench/idle_rss.py` measures it). A plugin cannot avoid it: it
is loaded after them. So C{python -m mqserver} (L{mqserver.__main__}) calls
L{defer_imports} and then runs twistd.

L{defer_imports} puts a L{LazyModule} in C{sys.modules} for each module of L{DEFERRED}:
an empty module with the real one's spec (C{__name__}, C{__spec__}, C{__file__}...), so
C{import ssl} and C{from http import cookiejar} succeed without running the module;
the first attribute it does not have yet (C{ssl.SSLContext}, C{hashlib.sha1}, ...) runs
the real module in that same object, which then is an ordinary module. So a module
another imports at start-up but uses only later (or never) costs nothing until then, and
every use finds what it would have found.

A module is deferred only when it is not imported yet and it and the C extensions it
needs are found (otherwise its importers' C{try: import ...} must see the failure at
import time, as before): the fallback is the ordinary import.
"""

import importlib.machinery
import importlib.util
import sys
import threading
import types

__all__ = ["DEFERRED", "LazyModule", "defer_imports"]

#: Module -> the C extensions it cannot import without (a missing one means no deferral,
#: so its importers' C{try: import ...} sees the ImportError as it would have).
#: C{asyncio.sslproto} reads C{ssl} attributes at import, so it is deferred with it.
DEFERRED = {
    "http.cookiejar": (),
    "ssl": ("_ssl",),
    "asyncio.sslproto": ("_ssl",),
    "hashlib": (),
    "hmac": (),
    "pdb": (),
}

_lock = threading.RLock()
_pending = {}  # module name -> its spec, until its first use runs it


class LazyModule(types.ModuleType):
    """A module whose code runs at the first lookup of an attribute it lacks."""

    def __getattr__(self, name):
        self._run()
        return types.ModuleType.__getattribute__(self, name)

    def __dir__(self):
        self._run()
        return types.ModuleType.__dir__(self)

    def _run(self):
        with _lock:
            spec = _pending.pop(self.__name__, None)
            if spec is not None:
                _load(self, spec)


def _load(module, spec):
    try:
        spec.loader.exec_module(module)
    except BaseException:
        # as a failed import: the module leaves sys.modules (and its parent)
        if sys.modules.get(spec.name) is module:
            del sys.modules[spec.name]
        parent, _, leaf = spec.name.rpartition(".")
        if getattr(sys.modules.get(parent), leaf, None) is module:
            delattr(sys.modules[parent], leaf)
        raise
    finally:
        module.__class__ = types.ModuleType


def _find(name):
    """The spec of C{name}, found without importing it or its parent package."""
    parent, _, _ = name.rpartition(".")
    if not parent:
        return importlib.util.find_spec(name)
    owner = sys.modules.get(parent)
    parent_spec = owner.__spec__ if owner is not None else importlib.util.find_spec(parent)
    if parent_spec is None or parent_spec.submodule_search_locations is None:
        return None
    return importlib.machinery.PathFinder.find_spec(name, parent_spec.submodule_search_locations)


def _defer(name, needs):
    if name in sys.modules:
        return False
    try:
        spec = _find(name)
        found = spec is not None and all(importlib.util.find_spec(n) for n in needs)
    except (ImportError, ValueError):
        return False
    if not found or spec.loader is None or not hasattr(spec.loader, "exec_module"):
        return False
    module = importlib.util.module_from_spec(spec)
    module.__class__ = LazyModule
    _pending[name] = spec
    sys.modules[name] = module
    parent, _, leaf = name.rpartition(".")
    if parent:
        # An import finding the submodule in sys.modules does not bind it in its
        # package, so bind it as its own import would (the package's import now finds
        # the stand-in: asyncio's is due soon anyway, from twisted.internet.defer).
        package = importlib.import_module(parent)
        if not hasattr(package, leaf):
            setattr(package, leaf, module)
    return True


def defer_imports(modules=DEFERRED):
    """Put a L{LazyModule} in C{sys.modules} for each of C{modules} (name -> C extensions
    it needs) that can be deferred; return the names deferred."""
    with _lock:
        return [name for name, needs in modules.items() if _defer(name, needs)]
