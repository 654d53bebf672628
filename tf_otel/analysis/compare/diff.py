"""Run against run: what changed between two trainings, where, and by how much.

Usage::

    report = diff_profiles(baseline, candidate)   # two ``profile.run_profile`` dicts
    report["verdict"]["change"]                    # "slower", "faster" or "no change"
    report["moved"]                                # ["input +20.1 ms a step (...)", ...]

Noise: each run's own step-to-step spread decides what counts. The step time changes when
its median moved by more than ``max(3 x the standard error of the difference of the medians,
MIN_STEP_SHARE x the baseline's median)``: the standard error from each run's robust sigma
(1.4826 x MAD) and step count (1.2533 sigma / sqrt(n) a median), so the threshold narrows as
the runs grow and stays below their own spread. A category, a rank's own work, or a name on
the path moves when its median a step (a name: its mean) changed by more than ``max(3 x the
standard error of the difference, MIN_PART_SHARE x the baseline's median step)``.

Shapes: ranks are matched by number where both runs had the same ranks, else by role (rank 0,
the rank with the median own work, the slowest); every figure is a mean a step, so runs of
different lengths compare; the two main step functions are compared whatever their names
(said where they differ); findings are matched by rule and ranks (by rule alone where the
ranks were matched by role).
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

from tf_otel.analysis.path.critical_path import PATH_CATEGORIES

MIN_STEP_SHARE = 0.01  # a step-time change below 1 % of the baseline's median is no change
MIN_PART_SHARE = 0.01  # the same floor for a category, a rank or a name (of the median step)
Z = 3.0  # standard errors
MEDIAN_SE = 1.2533  # the standard error of a median: 1.2533 sigma / sqrt(n)
TOP = 5  # names listed in each of appeared / vanished / changed


def _se(sd: Optional[float], n: int, factor: float = 1.0) -> float:
    return factor * (sd or 0.0) / math.sqrt(n) if n > 0 else 0.0


def _threshold(se_a: float, se_b: float, floor: float) -> float:
    return max(Z * math.hypot(se_a, se_b), floor)


def _round(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 3)


def diff_profiles(baseline: Dict[str, Any], candidate: Dict[str, Any]) -> Dict[str, Any]:
    """The diff of two profiles (see the module docstring)."""
    a, b = baseline["step_ms"], candidate["step_ms"]
    if not a["n"] or not b["n"]:
        raise ValueError("a run without steady steps cannot be compared")
    base_median = a["median"]
    step_threshold = _threshold(
        _se(a["sigma"], a["n"], MEDIAN_SE),
        _se(b["sigma"], b["n"], MEDIAN_SE),
        MIN_STEP_SHARE * base_median,
    )
    delta = b["median"] - a["median"]
    change = "no change"
    if abs(delta) > step_threshold:
        change = "slower" if delta > 0 else "faster"
    part_floor = MIN_PART_SHARE * base_median
    categories = _categories(baseline, candidate, part_floor)
    ranks, matched_by = _ranks(baseline, candidate, part_floor)
    names = _names(baseline, candidate, part_floor)
    notes = []
    if baseline.get("series") != candidate.get("series"):
        notes.append(
            f"another step function: baseline {baseline.get('series') or '(unnamed)'}, "
            f"candidate {candidate.get('series') or '(unnamed)'}; their main steps are compared"
        )
    if matched_by == "role":
        notes.append(
            f"another number of ranks ({len(baseline['ranks'])} -> {len(candidate['ranks'])}): "
            "ranks matched by role (rank 0, the median rank, the slowest), figures a step"
        )
    for name, side in (("baseline", baseline), ("candidate", candidate)):
        if side["step_ms"]["n"] < 10:
            notes.append(f"the {name} has {side['step_ms']['n']} steady steps: a weak verdict")
    return {
        "verdict": {
            "change": change,
            "baseline_median_ms": _round(a["median"]),
            "candidate_median_ms": _round(b["median"]),
            "delta_ms": _round(delta),
            "ratio": round(b["median"] / base_median, 4) if base_median else None,
            "threshold_ms": _round(step_threshold),
            "baseline_sigma_ms": _round(a["sigma"]),
            "candidate_sigma_ms": _round(b["sigma"]),
            "steps": [a["n"], b["n"]],
        },
        "throughput": {
            "baseline_steps_per_s": baseline.get("steps_per_s"),
            "candidate_steps_per_s": candidate.get("steps_per_s"),
        },
        "by_category": categories,
        "by_rank": {"matched_by": matched_by, "ranks": ranks},
        "moved": _moved(change, categories, ranks),
        "names": names,
        "findings": _findings(baseline, candidate, matched_by),
        "notes": notes,
    }


def _categories(
    baseline: Dict[str, Any], candidate: Dict[str, Any], floor: float
) -> List[Dict[str, Any]]:
    rows = []
    for category in PATH_CATEGORIES:
        a = baseline["by_category"].get(category, {})
        b = candidate["by_category"].get(category, {})
        if a.get("median_ms") is None or b.get("median_ms") is None:
            which = [
                n for n, x in (("baseline", a), ("candidate", b)) if x.get("median_ms") is None
            ]
            rows.append(
                {
                    "category": category,
                    "measured": False,
                    "not_measured_in": which,
                    "baseline_ms": _round(a.get("median_ms")),
                    "candidate_ms": _round(b.get("median_ms")),
                }
            )
            continue
        threshold = _threshold(
            _se(a["sigma_ms"], a["measured_steps"], MEDIAN_SE),
            _se(b["sigma_ms"], b["measured_steps"], MEDIAN_SE),
            floor,
        )
        delta = b["median_ms"] - a["median_ms"]
        rows.append(
            {
                "category": category,
                "measured": True,
                "baseline_ms": _round(a["median_ms"]),
                "candidate_ms": _round(b["median_ms"]),
                "delta_ms": _round(delta),
                "threshold_ms": _round(threshold),
                "moved": abs(delta) > threshold,
            }
        )
    return rows


def _roles(by_rank: Dict[str, Any]) -> Dict[str, str]:
    """role -> rank (as text): rank 0, the median rank and the slowest by own work."""
    ranks = sorted(by_rank, key=int)
    work = {r: by_rank[r].get("work_ms") or 0.0 for r in ranks}
    ordered = sorted(ranks, key=lambda r: (work[r], int(r)))
    roles = {"rank 0": ranks[0]} if ranks else {}
    if ordered:
        roles["median rank"] = ordered[(len(ordered) - 1) // 2]
        roles["slowest rank"] = ordered[-1]
    return roles


def _ranks(
    baseline: Dict[str, Any], candidate: Dict[str, Any], floor: float
) -> Tuple[List[Dict[str, Any]], str]:
    a_ranks, b_ranks = baseline["by_rank"], candidate["by_rank"]
    if set(a_ranks) == set(b_ranks):
        pairs = [(f"rank {r}", r, r) for r in sorted(a_ranks, key=int)]
        matched_by = "rank"
    else:
        a_roles, b_roles = _roles(a_ranks), _roles(b_ranks)
        pairs = [(role, a_roles[role], b_roles[role]) for role in a_roles if role in b_roles]
        matched_by = "role"
    rows = []
    for label, ra, rb in pairs:
        a, b = a_ranks[ra], b_ranks[rb]
        row: Dict[str, Any] = {
            "label": label,
            "baseline_rank": int(ra),
            "candidate_rank": int(rb),
            "baseline_path_ms": _round(a.get("path_ms")),
            "candidate_path_ms": _round(b.get("path_ms")),
            "baseline_work_ms": _round(a.get("work_ms")),
            "candidate_work_ms": _round(b.get("work_ms")),
            "moved": False,
        }
        if a.get("work_ms") is not None and b.get("work_ms") is not None:
            threshold = _threshold(
                _se(a.get("work_sigma_ms"), a.get("work_steps", 0), MEDIAN_SE),
                _se(b.get("work_sigma_ms"), b.get("work_steps", 0), MEDIAN_SE),
                floor,
            )
            delta = b["work_ms"] - a["work_ms"]
            row.update(
                work_delta_ms=_round(delta),
                threshold_ms=_round(threshold),
                moved=abs(delta) > threshold,
            )
        rows.append(row)
    return rows, matched_by


def _moved(change: str, categories: List[Dict[str, Any]], ranks: List[Dict[str, Any]]) -> List[str]:
    """What moved, largest first, with the rank it happened on where one rank stands out."""
    lines = []
    moved_ranks = [r for r in ranks if r.get("moved")]
    deltas = [r["work_delta_ms"] for r in moved_ranks]
    # one rank (or a few) moved while the others did not: the change happened there
    lone = moved_ranks if moved_ranks and len(moved_ranks) * 2 <= len(ranks) else []
    for row in sorted((c for c in categories if c.get("moved")), key=lambda c: -abs(c["delta_ms"])):
        text = f"{row['category']} {row['delta_ms']:+.1f} ms a step"
        if lone:
            where = ", ".join(f"{r['label']}'s own work {r['work_delta_ms']:+.1f} ms" for r in lone)
            text += f" ({where}; the other ranks' did not move)"
        elif moved_ranks and len(moved_ranks) == len(ranks):
            text += f" (every rank's own work {min(deltas):+.1f} to {max(deltas):+.1f} ms)"
        lines.append(text)
    if not lines and lone:
        lines = [f"{r['label']}'s own work {r['work_delta_ms']:+.1f} ms a step" for r in lone]
    if change == "no change" and not lines:
        return []
    return lines


def _names(baseline: Dict[str, Any], candidate: Dict[str, Any], floor: float) -> Dict[str, Any]:
    a = {(n["category"], n["name"]): n["mean_ms"] for n in baseline.get("names", [])}
    b = {(n["category"], n["name"]): n["mean_ms"] for n in candidate.get("names", [])}

    def row(key: Tuple[str, str], delta: float) -> Dict[str, Any]:
        return {
            "category": key[0],
            "name": key[1],
            "baseline_ms": _round(a.get(key)),
            "candidate_ms": _round(b.get(key)),
            "delta_ms": _round(delta),
        }

    appeared = sorted((k for k in b if k not in a and b[k] > floor), key=lambda k: -b[k])
    vanished = sorted((k for k in a if k not in b and a[k] > floor), key=lambda k: -a[k])
    both = [k for k in a if k in b and abs(b[k] - a[k]) > floor]
    changed = sorted(both, key=lambda k: -abs(b[k] - a[k]))
    return {
        "appeared": [row(k, b[k]) for k in appeared[:TOP]],
        "vanished": [row(k, -a[k]) for k in vanished[:TOP]],
        "changed": [row(k, b[k] - a[k]) for k in changed[:TOP]],
        "threshold_ms": _round(floor),
    }


def _findings(
    baseline: Dict[str, Any], candidate: Dict[str, Any], matched_by: str
) -> Dict[str, List[Dict[str, Any]]]:
    def key(finding: Dict[str, Any]) -> Tuple[Any, ...]:
        ranks = tuple(finding.get("ranks", ())) if matched_by == "rank" else ()
        return (finding["rule"], ranks)

    a = {key(f): f for f in baseline.get("findings", [])}
    b = {key(f): f for f in candidate.get("findings", [])}
    return {
        "only_baseline": [a[k] for k in a if k not in b],
        "only_candidate": [b[k] for k in b if k not in a],
    }
