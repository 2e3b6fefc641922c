"""The console: a line protocol for telnet-style debugging and msgout's long connection."""
