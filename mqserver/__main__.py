"""C{python -m mqserver ARGS} is C{twistd ARGS}: it runs twistd as its own script does,
so C{python -m mqserver -n mqserver --config config.yaml} serves as
C{twistd -n mqserver --config config.yaml}, but an error in twistd's own options is one
line, not its usage text.
"""

import sys


def main():
    """Run twistd with this process's arguments (as its script does, but an error in
    twistd's own options is one line, not its usage text)."""
    from twisted.python import usage
    from twisted.scripts.twistd import ServerOptions, runApp

    options = ServerOptions()
    try:
        options.parseOptions()
    except usage.UsageError as e:
        from mqserver.tap import refuse_start

        refuse_start(e)
    runApp(options)
    from mqserver import exitstatus

    sys.exit(exitstatus.status())


if __name__ == "__main__":
    main()
