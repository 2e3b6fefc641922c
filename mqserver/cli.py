"""The ``mqserver`` command (a console script of the package):

    mqserver run [OPTIONS]              the broker in the foreground (OPTIONS: the twistd
                                        plugin's, e.g. --config config.yaml, --data DIR,
                                        --listen NAME=ENDPOINT; see mqserver run --help)
    mqserver config [OPTIONS]           the effective configuration (defaults, then the
                                        file, then the command line) as YAML
    mqserver config --check FILE        validate FILE: exit 0, or one line saying what is
                                        wrong and exit 1
    mqserver config --reference         every key of the core and of each front door
                                        (docs/configuration.md), as Markdown
    mqserver --version

``mqserver run ARGS`` is ``python -m mqserver -n --pidfile= mqserver ARGS``: twistd
(L{mqserver.__main__}), not daemonised, no pid file.
"""

import argparse
import sys

#: twistd's options of ``mqserver run``: in the foreground, without a pid file.
RUN_TWISTD_OPTIONS = ["-n", "--pidfile="]


def run(args):
    """Run the broker with the plugin options C{args}, as C{python -m mqserver} does."""
    from mqserver.__main__ import main as twistd_main

    sys.argv = ["mqserver", *RUN_TWISTD_OPTIONS, "mqserver", *args]
    twistd_main()
    return 0


def effective_config(args):
    """Return the L{mqserver.config.Config} the plugin options C{args} give (the same
    parsing and checks as C{mqserver run}, but nothing of this host is looked at: a
    config is checked as well while its broker runs); raises L{ConfigError} with one
    line."""
    from twisted.python import usage

    from mqserver.config import ConfigError
    from mqserver.tap import ConfigOptions

    options = ConfigOptions()
    try:
        options.parseOptions(args)
    except usage.UsageError as e:
        raise ConfigError(str(e)) from None
    return options["settings"]


def config_yaml(config):
    """Return C{config} as a YAML document a config file may hold: dotted keys nested,
    keys without a value (C{port}, unless set) left out, C{listen:} last (a door that is
    off as C{off})."""
    import yaml

    tree = {}
    for key, value in config.values.items():
        if value is None:
            continue
        node = tree
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    tree["listen"] = {name: desc if desc is not None else "off"
                      for name, desc in config.listen.items()}
    return yaml.safe_dump(tree, sort_keys=False, default_flow_style=False)


def config_command(opts, rest):
    """C{mqserver config}: print the effective configuration, or check one file."""
    from mqserver.config import ConfigError

    if opts.reference:
        from mqserver.configdoc import reference
        from mqserver.frontdoor import front_doors

        sys.stdout.write(reference(front_doors()))
        return 0
    if opts.check is not None:
        if rest:
            return _fail(f"config --check takes one file, not {' '.join(rest)}", 2)
        try:
            effective_config(["--config", opts.check])
        except ConfigError as e:
            return _fail(f"{opts.check}: {e}")
        print(f"{opts.check}: valid")
        return 0
    try:
        config = effective_config(rest)
    except ConfigError as e:
        return _fail(str(e))
    sys.stdout.write(config_yaml(config))
    return 0


def _fail(text, status=1):
    print(f"mqserver: {text}", file=sys.stderr)
    return status


def build_parser():
    from mqserver.version import version

    p = argparse.ArgumentParser(
        prog="mqserver",
        description="A message broker speaking smss, RocketMQ remoting and NSQ over one "
                    "commit log.")
    p.add_argument("--version", action="version", version=f"mqserver {version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="{run,config}")
    sub.add_parser("run", help="run the broker in the foreground (mqserver run --help: its "
                               "options)", add_help=False)
    c = sub.add_parser(
        "config", help="print the effective configuration, or check a file",
        description="Print the effective configuration as YAML: the defaults, then the "
                    "file given with --config, then the other options (those of "
                    "mqserver run: --data, --role, --master, --listen NAME=ENDPOINT, ...).")
    c.add_argument("--check", metavar="FILE", help="validate FILE: exit 0, or say what is "
                                                   "wrong and exit 1")
    c.add_argument("--reference", action="store_true",
                   help="print every configuration key (docs/configuration.md) as Markdown")
    return p


def main(argv=None):
    """Entry point of the C{mqserver} console script; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["run"]:
        # everything after "run" is the plugin's (twistd's parser reads it, --help too)
        return run(argv[1:])
    opts, rest = build_parser().parse_known_args(argv)
    return config_command(opts, rest)


if __name__ == "__main__":
    sys.exit(main())
