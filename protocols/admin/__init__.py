"""Front door ``admin``: the broker's admin API (HTTP/JSON on loopback) that ``mqctl``
talks to."""
