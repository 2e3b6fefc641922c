"""mqserver reads no private state of Twisted objects outside its one checked adapter
(docs/architecture.md, "One checked adapter for Twisted internals").

A read of such an attribute works until a Twisted release renames it, and then fails
only on the path that reads it. The ones the code used to read are named here with the
public way instead; the fast paths' reads of the reactor and of TCP transports are
listed and checked at start-up by L{mqserver.runtime.fastpath} (tests/unit/test_fastpath.py).
"""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: attribute -> what to use instead
FORBIDDEN = {
    "result": "Deferred.result: a callback, or a synchronous answer (Broker.publish_now)",
    "_disconnected": "Request._disconnected: request.notifyFinish() "
                     "(mqserver.webrequest.departure)",
    "_chainedTo": "Deferred._chainedTo: a callback",
    "_runningCallbacks": "Deferred._runningCallbacks: a callback",
}


def _reads(path):
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in FORBIDDEN:
            yield node.lineno, node.attr


def test_no_private_attribute_of_a_twisted_object_is_read():
    found = []
    for package in ("mqserver", "protocols"):
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    found += [f"{os.path.relpath(path, ROOT)}:{line}: {FORBIDDEN[attr]}"
                              for line, attr in _reads(path)]
    assert found == []
