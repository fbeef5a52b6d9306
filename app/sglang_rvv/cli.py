"""``sglang-rvv COMMAND``: the project's command line (``report`` so far; one module per command)."""

from __future__ import annotations

import argparse
import sys

from .bench import report

COMMANDS = {"report": report}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sglang-rvv", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module in COMMANDS.items():
        module.add_arguments(sub.add_parser(name, help=module.__doc__.splitlines()[0],
                                            description=module.__doc__.split("\n\n")[1]))
    args = parser.parse_args(argv)
    return COMMANDS[args.command].run(args)


if __name__ == "__main__":
    sys.exit(main())
