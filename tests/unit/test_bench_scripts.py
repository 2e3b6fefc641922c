"""The benchmarks stand on one harness: bench/harness.py is the only module of bench/
that puts the source tree on the import path or imports the test suite; every other
script imports it before anything of the project's. Read from the source with C{ast},
so nothing here runs a benchmark."""

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "bench")
PROJECT = ("mqserver", "protocols", "tests", "spark")
SCRIPTS = sorted(f for f in os.listdir(BENCH) if f.endswith(".py") and f != "harness.py")


def tree(name):
    with open(os.path.join(BENCH, name)) as f:
        return ast.parse(f.read(), name)


def imported(node):
    """The module names an import statement names."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0:
        return [node.module]
    return []


def touches_sys_path(node):
    """Whether C{node} assigns to or calls a method of C{sys.path}."""
    for sub in ast.walk(node):
        if (isinstance(sub, ast.Attribute) and sub.attr == "path"
                and isinstance(sub.value, ast.Name) and sub.value.id == "sys"):
            return True
    return False


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_leaves_the_import_path_and_the_tests_to_the_harness(name):
    t = tree(name)
    for node in ast.walk(t):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.Expr)):
            assert not touches_sys_path(node), f"{name}:{node.lineno} changes sys.path"
        for module in imported(node):
            assert module.split(".")[0] != "tests", f"{name}:{node.lineno} imports {module}"
            assert module.split(".")[0] != "bench", f"{name}:{node.lineno} imports {module}"


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_imports_the_harness_before_the_project(name):
    """At module level, the harness comes before any import of the project's packages
    (run as C{python bench/NAME.py}, only bench/ is on the path until it runs)."""
    harness_seen = False
    for node in tree(name).body:
        for module in imported(node):
            top = module.split(".")[0]
            if top == "harness":
                harness_seen = True
            elif top in PROJECT:
                assert harness_seen, f"{name}:{node.lineno} imports {module} before harness"


def test_harness_is_the_one_that_sets_the_path():
    t = tree("harness.py")
    assert any(touches_sys_path(n) for n in t.body)
