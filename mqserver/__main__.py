"""C{python -m mqserver ARGS} is C{twistd ARGS} with a leaner start-up.

It defers the standard-library modules twistd imports but an idle broker does not use
(L{mqserver.leanstart}), then runs twistd as its own script does: C{python -m mqserver
-n mqserver --config config.yaml} serves as C{twistd -n mqserver --config config.yaml},
in about 7 MB less resident memory.
"""

from mqserver.leanstart import defer_imports


def main():
    """Defer the modules, then run twistd with this process's arguments."""
    # before anything imports Twisted: twistd's own imports then find the stand-ins
    defer_imports()
    from twisted.scripts.twistd import run

    run()


if __name__ == "__main__":
    main()
