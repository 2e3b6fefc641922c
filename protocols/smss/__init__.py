"""The smss protocol: 20-byte request headers, 10-byte response headers."""
