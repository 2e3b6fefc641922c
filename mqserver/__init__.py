"""mqserver: the broker core. It knows nothing of any wire format."""

#: The version when the package is not installed; the same as setup.cfg's ``version``
#: (a test checks). L{mqserver.version.version} is the one to show.
__version__ = "0.1.0"
