"""Write the README's settings table from the settings tf_otel/config.py declares.

Usage::

    make settings-table                                 # rewrite README.md's table
    .venv/bin/python scripts/settings_table.py --check  # exit 1 where README.md is out of step

The table lies between the BEGIN and END markers below; the rest of README.md is left alone.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tf_otel.settings_cli import markdown_table  # noqa: E402

README = REPO / "README.md"
BEGIN = "<!-- settings table: made from tf_otel/config.py by `make settings-table` -->\n"
END = "<!-- end of the settings table -->\n"


def with_table(text: str) -> str:
    """``text`` (a README) with the generated table between the markers."""
    head, begin, rest = text.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"README.md lacks the markers {BEGIN.strip()} ... {END.strip()}")
    return head + BEGIN + "\n" + markdown_table() + "\n" + END + tail


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether it is in step")
    args = parser.parse_args()
    text = README.read_text(encoding="utf-8")
    made = with_table(text)
    if args.check:
        if made != text:
            print("README.md's settings table is out of step: run make settings-table")
            return 1
        return 0
    if made != text:
        README.write_text(made, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
