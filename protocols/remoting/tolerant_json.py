"""Reading the fastjson dialect Java peers may send: bare integer map keys."""

import json
import re

_BARE_KEY = re.compile(rb'([{,])\s*(-?\d+)\s*:')


def loads_tolerant(data):
    """Parse JSON bytes, accepting bare integer keys (C{{0:"addr"}}) and control
    characters inside strings. Raises ValueError, also for nesting deeper than the
    parser's recursion limit."""
    data = bytes(data)
    try:
        return _loads(data)
    except ValueError:
        pass
    # Only rewrite when plain parsing failed: the pattern could match inside strings.
    return _loads(_BARE_KEY.sub(rb'\1"\2":', data))


def loads_object(data):
    """L{loads_tolerant} for bodies that must be a JSON object; returns the dict.
    Raises ValueError for anything else."""
    obj = loads_tolerant(data)
    if not isinstance(obj, dict):
        raise ValueError("JSON body is not an object")
    return obj


def _loads(data):
    try:
        return json.loads(data, strict=False)
    except RecursionError:
        # json's C scanner recurses once per nesting level; a frame of 100,000 "["
        # must be a refused request, not an unhandled error
        raise ValueError("JSON nested too deeply") from None
