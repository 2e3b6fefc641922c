"""Build the optional C speedups (mqserver/speedups.py); everything else is in setup.cfg.

Each extension is optional: without a C compiler the install still succeeds and the
broker runs the pure-Python code they speed up."""

from setuptools import Extension, setup

SPEEDUPS = [
    ("mqserver.broker._inflight", "mqserver/broker/_inflight.c", []),
    ("mqserver.store._pack", "mqserver/store/_pack.c", []),
    ("mqserver.store._hash", "mqserver/store/_hash.c", []),
    ("mqserver.store._index", "mqserver/store/_index.c", []),
    # zlib's crc32 (the one Python's zlib module wraps); without zlib's headers this one
    # is not built and the store checks records in Python.
    ("mqserver.store._check", "mqserver/store/_check.c", ["z"]),
    ("protocols.smss._push", "protocols/smss/_push.c", []),
    ("protocols.smss._pub", "protocols/smss/_pub.c", []),
    ("protocols.smss._feed", "protocols/smss/_feed.c", []),
    ("protocols.nsq._frames", "protocols/nsq/_frames.c", []),
    ("protocols.remoting._pull", "protocols/remoting/_pull.c", []),
    ("protocols.remoting._header", "protocols/remoting/_header.c", []),
]

setup(
    ext_modules=[
        Extension(name, [source], include_dirs=["mqserver"],
                  depends=["mqserver/_bytes.h", "mqserver/_javahash.h"],
                  libraries=libs, optional=True, extra_compile_args=["-O2"])
        for name, source, libs in SPEEDUPS
    ],
)
