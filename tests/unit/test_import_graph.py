"""The import graph of C{mqserver/} and C{protocols/} points one way (docs/architecture.md).

Every import statement counts, the ones inside functions too: an import moved into a
function to dodge a circular import still ties the two modules together
(C{protocols.nsq.node} and C{protocols.nsq.lookupd_client} imported each other that way).
The graph is read from the source with C{ast}, so the test imports nothing it checks.
"""

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGES = ("mqserver", "protocols")


def _modules():
    """Dotted module name -> path of every Python module of L{PACKAGES}."""
    found = {}
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                    found[dotted.removesuffix(".__init__")] = path
    return found


def _imported(module, path):
    """Every dotted name an import statement of C{module} may refer to (a
    C{from a import b} names both C{a} and C{a.b}, as b may be a module)."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    package = module.split(".") if path.endswith("__init__.py") else module.split(".")[:-1]
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the importing package
                parts = package[:len(package) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph():
    """Module -> the set of modules of L{PACKAGES} it imports."""
    modules = _modules()
    return {m: {n for n in _imported(m, p) if n in modules and n != m}
            for m, p in modules.items()}


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan's algorithm,
    iterative), each as a sorted list."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_the_cycle_finder_finds_a_cycle_through_three_modules():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_imports_inside_functions(graph):
    # protocols.nsq.lookupd imports get_node inside a function (no cycle: node does not
    # import lookupd); the graph must still see that edge
    assert "protocols.nsq.node" in graph["protocols.nsq.lookupd"]


def test_no_module_imports_itself_back(graph):
    assert cycles(graph) == []


def test_the_core_imports_no_protocol(graph):
    bad = sorted((m, d) for m, deps in graph.items() if m.startswith("mqserver")
                 for d in deps if d.startswith("protocols"))
    assert bad == []


def test_no_protocol_imports_another(graph):
    def door(name):
        return name.split(".")[1] if name.count(".") else None

    bad = sorted((m, d) for m, deps in graph.items() if m.startswith("protocols.")
                 for d in deps if d.startswith("protocols.") and door(d) != door(m))
    assert bad == []


def _twisted_imports(path):
    """The C{twisted.*} modules an import statement of the file at C{path} names."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return {n for n in names if n.startswith("twisted.")}


#: What the rest of the code may use of mqserver.runtime: the output object and calls in
#: the next turn (every door), and the reactor and TLS stack choices (start-up only).
RUNTIME_PUBLIC = {
    "mqserver.runtime.output": None,
    "mqserver.runtime.soon": None,
    "mqserver.runtime.fastpath": ("mqserver.tap", "mqserver.service"),
    "mqserver.runtime.tlsstack": ("mqserver.tap",),
}
#: Twisted's modules whose internals the tuned paths read: only mqserver.runtime imports them.
TWISTED_INTERNALS = ("twisted.internet.epollreactor", "twisted.internet.posixbase",
                     "twisted.internet.tcp", "twisted.internet._newtls",
                     "twisted.internet.abstract")


def test_the_runtime_package_is_used_through_its_public_modules(graph):
    bad = []
    for m, deps in graph.items():
        if m.startswith("mqserver.runtime"):
            continue
        for d in deps:
            if d == "mqserver.runtime" or not d.startswith("mqserver.runtime."):
                continue
            if d not in RUNTIME_PUBLIC:
                bad.append((m, d))
            elif RUNTIME_PUBLIC[d] is not None and m not in RUNTIME_PUBLIC[d]:
                bad.append((m, d))
    assert sorted(bad) == []


def test_only_the_runtime_package_imports_twisted_internals():
    modules = _modules()
    bad = sorted((m, n) for m, p in modules.items() if not m.startswith("mqserver.runtime")
                 for n in _twisted_imports(p) if n.startswith(TWISTED_INTERNALS))
    assert bad == []
    # the check sees the runtime package's own imports (it would pass vacuously otherwise)
    assert "twisted.internet.epollreactor" in _twisted_imports(
        modules["mqserver.runtime.reactor"])
def test_no_protocol_imports_the_store(graph):
    # doors reach the store only through the broker's interfaces (mqserver/interfaces.py:
    # IMessageLog, IReplicationLog, IStoreStats, IDataFiles)
    bad = sorted((m, d) for m, deps in graph.items() if m.startswith("protocols")
                 for d in deps if d == "mqserver.store" or d.startswith("mqserver.store."))
    assert bad == []


def store_reads(path):
    """(line, source) of every C{.store} attribute read in the module at C{path}."""
    source = open(path, encoding="utf-8").read()
    tree = ast.parse(source, path)
    return [(node.lineno, ast.get_source_segment(source, node)) for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr == "store"]


def test_store_reads_are_found():
    assert store_reads(os.path.join(ROOT, "mqserver", "broker", "channels.py"))


def test_no_protocol_reads_the_store_of_the_broker():
    # not even under another name (a door's own `self.store = broker.store` would hide
    # every later use): no protocol reads any attribute called `store`
    bad = []
    for module, path in sorted(_modules().items()):
        if module.startswith("protocols"):
            bad += [(module, line, text) for line, text in store_reads(path)]
    assert bad == []
