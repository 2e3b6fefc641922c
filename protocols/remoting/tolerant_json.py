"""Reading the fastjson dialect Java peers may send (spec 5.8): bare integer map keys."""

import json
import re

_BARE_KEY = re.compile(rb'([{,])\s*(-?\d+)\s*:')


def loads_tolerant(data):
    """Parse JSON bytes, accepting bare integer keys (C{{0:"addr"}}) and control
    characters inside strings. Raises ValueError."""
    data = bytes(data)
    try:
        return json.loads(data, strict=False)
    except ValueError:
        pass
    # Only rewrite when plain parsing failed: the pattern could match inside strings.
    return json.loads(_BARE_KEY.sub(rb'\1"\2":', data), strict=False)
