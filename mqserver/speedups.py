"""Optional C speedups of hot paths, with the pure-Python code as reference and fallback.

A speedup is an extension module built from a ``.c`` file beside the Python module it
speeds up (``setup.py`` lists them; a machine without a C compiler still installs, and
runs the Python code). L{load} returns the module, or None when it is not built or when
the environment variable C{MQSERVER_PURE_PYTHON} is set to a non-empty value other than
0 (to measure or debug the Python path).
"""

import importlib
import os

__all__ = ["load", "pure_python", "report"]

#: name -> True (the C module is in use) or False (the Python code runs), per load().
_state = {}


def pure_python():
    """Return True when C{MQSERVER_PURE_PYTHON} asks for the Python code only."""
    return os.environ.get("MQSERVER_PURE_PYTHON", "") not in ("", "0")


def load(name):
    """Return the extension module C{name} (dotted), or None (see the module docstring)."""
    module = None
    if not pure_python():
        try:
            module = importlib.import_module(name)
        except ImportError:
            pass
    _state[name] = module is not None
    return module


def report():
    """One line saying which speedups loaded so far are in use, for the start-up log."""
    used = sorted(n for n, ok in _state.items() if ok)
    unused = sorted(n for n, ok in _state.items() if not ok)
    if not unused:
        return f"C speedups in use: {', '.join(used)}"
    why = "MQSERVER_PURE_PYTHON is set" if pure_python() else "not built"
    return (f"C speedups in use: {', '.join(used) or 'none'}; pure Python for "
            f"{', '.join(unused)} ({why})")
