"""mqserver: the broker core. It knows nothing of any wire format."""

__version__ = "0.1.0"
