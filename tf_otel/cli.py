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
from typing import Any, List, Optional

# command -> the module that adds it with add_parser(subparsers), setting a ``func`` default that
# takes the parsed args. The name is kept here too so that a module that fails to import still
# shows as a command saying why, instead of vanishing from the list.
COMMANDS = {
    "analyze": "tf_otel.analysis.analyze_cli",
    "diff": "tf_otel.analysis.compare.diff_cli",
    "export": "tf_otel.analysis.export.export_cli",
    "clock-check": "tf_otel.clock.clock_check_cli",
    "nccl-plugin": "tf_otel.nccl.nccl_plugin_cli",
    "settings": "tf_otel.settings_cli",
}

BROKEN_EXIT = 1  # the installation is at fault, not the arguments (argparse uses 2 for those)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tf-otel", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command, module_name in COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            _add_unavailable(subparsers, command, module_name, error)
            continue
        module.add_parser(subparsers)
    return parser


def _add_unavailable(subparsers: Any, command: str, module_name: str, error: ImportError) -> None:
    """``command`` listed in --help as unavailable; running it prints why and exits 1."""
    reason = f"cannot import {module_name} ({type(error).__name__}: {error})"
    # prefix_chars no argument starts with: every argument lands in `ignored`, so the command's
    # own options give this message rather than argparse's "unrecognized arguments"
    broken = subparsers.add_parser(
        command,
        help="unavailable: " + reason.replace("%", "%%"),
        add_help=False,
        prefix_chars="\0",
    )
    broken.add_argument("ignored", nargs="*")

    def say(_: argparse.Namespace) -> int:
        print(f"tf-otel {command}: unavailable: {reason}", file=sys.stderr)
        return BROKEN_EXIT

    broken.set_defaults(func=say)


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
