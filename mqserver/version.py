"""The version of mqserver: one number for the broker, its tools and its answers."""

import functools

from mqserver import __version__

#: The distribution whose metadata holds the version (setup.cfg ``name``).
DISTRIBUTION = "mqserver"


@functools.cache
def version():
    """Return the installed package's version (setup.cfg ``version``), or
    L{mqserver.__version__} when the package is not installed (a source tree run with
    PYTHONPATH)."""
    # imported here: importlib.metadata brings the email package along, which only the
    # version lookup needs
    from importlib import metadata

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return __version__
