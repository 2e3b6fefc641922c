"""How mqserver runs on Twisted: the reactor it installs, and how its doors write.

C{server.reactor} chooses between the tuned paths (L{mqserver.runtime.reactor}'s
busy-polling reactor and L{mqserver.runtime.output}'s direct socket writes) and plain
Twisted (its epoll reactor and C{transport.write}); L{mqserver.runtime.fastpath} makes
that choice and falls back to plain Twisted when a release lacks what the tuned paths
read. L{mqserver.runtime.tlsstack} leaves Twisted's TLS stack out of a broker whose
configuration uses no TLS (C{server.tlsStack}). Doors use only
L{mqserver.runtime.output} and L{mqserver.runtime.soon}.
"""
