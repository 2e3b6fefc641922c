"""The logger of the store's parts."""

from twisted.logger import Logger

#: Every part logs as the store did before it was split, so the sources operators
#: filter on and docs/operations.md shows stay as they are.
NAMESPACE = "mqserver.store.store.MessageStore"


def store_logger(source):
    """Return a L{Logger} in the store's namespace with C{source} as its source."""
    return Logger(namespace=NAMESPACE, source=source)
