"""The ``tf-otel`` command line.

Usage::

    tf-otel analyze traces/ --format json
    tf-otel diff baseline/ candidate/
    horovodrun -np 2 tf-otel clock-check
    tf-otel nccl-plugin
    tf-otel settings --format json
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import List, Optional

# Each module exposes add_parser(subparsers) and sets a ``func`` default taking the parsed args.
_COMMAND_MODULES = (
    "tf_otel.analysis.cli",
    "tf_otel.analysis.diff_cli",
    "tf_otel.analysis.export.cli",
    "tf_otel.clock.cli",
    "tf_otel.nccl.cli",
    "tf_otel.settings_cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tf-otel", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        module.add_parser(subparsers)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
