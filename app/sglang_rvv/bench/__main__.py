"""``python -m sglang_rvv.bench {linear,layouts,one-batch,speculative,suite} [options]``."""

from __future__ import annotations

import argparse
import sys

from . import layouts, linear, one_batch, speculative, suite

SUITES = {"linear": linear, "layouts": layouts, "one-batch": one_batch, "speculative": speculative, "suite": suite}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_rvv.bench", description=__doc__)
    sub = parser.add_subparsers(dest="suite", required=True)
    for name, module in SUITES.items():
        module.add_arguments(sub.add_parser(name, help=module.__doc__.splitlines()[0]))
    args = parser.parse_args(argv)
    return SUITES[args.suite].run(args)


if __name__ == "__main__":
    sys.exit(main())
