"""``tf-otel settings``: every TF_OTEL_* setting's value in this environment and where it came from.

Usage::

    TF_OTEL_OPS_EVERY=10 tf-otel settings       # a process started here would use these
    tf-otel settings --format json              # [{"variable", "value", "source", ...}, ...]
    tf-otel settings --format markdown          # the README's table (make settings-table)

The values are those ``Settings.from_env`` gives in this process's environment: a bad value
shows the default used and why, an unknown TF_OTEL_* name is listed with the closest known one.
Secrets (``TF_OTEL_JOB_SECRET``, ``TF_OTEL_ADMIN_TOKEN``) are never printed.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any, Dict, List, Mapping

from tf_otel import cli_args
from tf_otel.config import SPECS, resolve, unknown

HIDDEN = "<hidden>"
TABLE_HEADER = "| variable | default | meaning |\n|---|---|---|\n"


def effective(env: Mapping[str, str]) -> List[Dict[str, Any]]:
    """One entry per setting: its variable, value, source ("environment" or "default"), the
    variable it came from where that is another of its names, and any value ignored."""
    entries: List[Dict[str, Any]] = []
    for spec in SPECS:
        found = resolve(spec, env)
        value = found.value
        if spec.secret and value is not None:
            value = HIDDEN
        entry: Dict[str, Any] = {
            "variable": spec.variables[0],
            "value": list(value) if isinstance(value, tuple) else value,
            "source": "default" if found.variable is None else "environment",
        }
        if found.variable not in (None, spec.variables[0]):
            entry["from"] = found.variable
        if found.rejected:
            entry["ignored"] = [
                f"{name}={HIDDEN if spec.secret else repr(raw)} ({why})"
                for name, raw, why, _ in found.rejected
            ]
        entries.append(entry)
    return entries


def _text(env: Mapping[str, str]) -> str:
    entries = effective(env)
    width = max(len(entry["variable"]) for entry in entries)
    values = [json.dumps(entry["value"], ensure_ascii=False) for entry in entries]
    value_width = min(24, max(map(len, values)))
    lines = []
    for entry, value in zip(entries, values):
        source = entry["source"]
        if "from" in entry:
            source += f" ({entry['from']})"
        for ignored in entry.get("ignored", ()):
            source += f"; ignored {ignored}"
        lines.append(f"{entry['variable']:<{width}}  {value:<{value_width}}  {source}")
    for name, close in unknown(env):
        hint = f"; did you mean {close}?" if close else ""
        lines.append(f"{name:<{width}}  {'':<{value_width}}  unknown, ignored{hint}")
    return "\n".join(lines) + "\n"


def markdown_table() -> str:
    """The README's settings table: one row per setting, as ``Settings`` declares it."""
    rows = []
    for spec in SPECS:
        names = ", ".join(f"`{name}`" for name in spec.variables)
        rows.append(f"| {names} | {spec.shown} | {spec.doc} |\n")
    return TABLE_HEADER + "".join(rows)


def run(args: argparse.Namespace) -> int:
    env = os.environ
    if args.format == "json":
        unknown_names = [{"variable": name, "closest": close} for name, close in unknown(env)]
        document = {"settings": effective(env), "unknown": unknown_names}
        print(json.dumps(document, indent=2, ensure_ascii=False))
    elif args.format == "markdown":
        print(markdown_table(), end="")
    else:
        print(_text(env), end="")
    return 0


def add_parser(subparsers: Any) -> None:
    parser = cli_args.subcommand(
        subparsers,
        "settings",
        "every TF_OTEL_* setting's value here and where it came from",
        __doc__,
        epilog=False,
    )
    parser.add_argument("--format", choices=("text", "json", "markdown"), default="text")
    parser.set_defaults(func=run)
