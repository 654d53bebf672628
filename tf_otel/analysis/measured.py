"""What each step measured, and the whole job's shares over the steps where each was measured.

Usage::

    measured = measured_categories(step_trace)   # frozenset of critical_path.PATH_CATEGORIES
    not_measured(measured)                       # {"input": "TF_OTEL_INPUT_WAIT=1 measures it"}
    shares = category_shares([(path.by_category(), measured), ...])
    shares["input"].share                        # None: measured on no step

A path category whose source was off for a step has no spans in it, so the path shows it as 0
and its time as ``compute`` (the residual). The reports must say "not measured" instead, so:

- ``input`` is measured when every rank's step span carries ``tf_otel.input.wait_ns`` or the
  step has ``input`` spans; where every rank saw no tf.data dataset
  (``tf_otel.input.tf_data_seen=false``) the reason is "no tf.data input seen", not a setting;
- ``communication`` and ``straggler_wait`` are measured when the step has a collective or
  transfer span, or when the job is one process with one rank and no MirroredStrategy over
  several devices (nothing to communicate: measured as 0);
- ``compute``, ``framework`` and ``before_step`` are always measured, but ``compute`` then also
  holds what was not measured in the step.

A category's job share is its time on the path over the steady steps where it was measured,
divided by the path's length over those same steps; measured on no step, it has none.
Rules and their reasons: docs/guides/ANALYSIS.md, "What is measured".
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Tuple

from tf_otel.analysis.model import as_int
from tf_otel.analysis.path.critical_path import (
    PATH_BEFORE_STEP,
    PATH_CATEGORIES,
    PATH_COMMUNICATION,
    PATH_COMPUTE,
    PATH_FRAMEWORK,
    PATH_INPUT,
    PATH_STRAGGLER_WAIT,
)
from tf_otel.analysis.steps import StepTrace
from tf_otel.record import (
    ATTR_INPUT_SEEN,
    ATTR_INPUT_WAIT,
    ATTR_STEP_REPLICAS,
    COLLECTIVE,
    COLLECTIVE_TRANSFER,
    COLLECTIVE_WAIT,
    INPUT,
    TRANSFER,
)

NOT_MEASURED = "not measured"
INPUT_SETTING = "TF_OTEL_INPUT_WAIT=1 measures it"
COMMUNICATION_SETTING = (
    "TF_OTEL_HOROVOD_EVERY=N measures Horovod collectives; "
    "TF_OTEL_OPS_EVERY=N parameter-server transfers"
)
# what turns each category's source on; the categories not named here are always measured
SETTINGS: Dict[str, str] = {
    PATH_INPUT: INPUT_SETTING,
    PATH_COMMUNICATION: COMMUNICATION_SETTING,
    PATH_STRAGGLER_WAIT: COMMUNICATION_SETTING,
}
ALWAYS_MEASURED = frozenset((PATH_COMPUTE, PATH_FRAMEWORK, PATH_BEFORE_STEP))
# in a step's measured set: input was not measured because there was no tf.data input to
# measure (``record.ATTR_INPUT_SEEN``), not because a setting was off
NO_TF_DATA = "input:no_tf_data"
NO_TF_DATA_TEXT = "no tf.data input seen"
_COMMUNICATION_SPANS = frozenset((COLLECTIVE, COLLECTIVE_WAIT, COLLECTIVE_TRANSFER, TRANSFER))
_CATEGORY = attrgetter("category")

# (a step's path time by category, the categories it measured)
StepSplit = Tuple[Mapping[str, int], FrozenSet[str]]


def _no_tf_data(trace: StepTrace) -> bool:
    """Every rank's step span says its process had iterated no tf.data dataset."""
    return bool(trace.ranks) and all(
        timeline.step_span is not None
        and timeline.step_span.attributes.get(ATTR_INPUT_SEEN) is False
        for timeline in trace.ranks.values()
    )


def _input_measured(trace: StepTrace, categories: FrozenSet[str]) -> bool:
    if INPUT in categories:
        return True
    # the hook writes the attribute (0 included) on every sampled step span of the rank; a rank
    # without it, or without its step span, may have waited unseen
    return all(
        timeline.step_span is not None
        and as_int(timeline.step_span.attributes.get(ATTR_INPUT_WAIT)) is not None
        for timeline in trace.ranks.values()
    )


def _communication_measured(trace: StepTrace, categories: FrozenSet[str]) -> bool:
    if categories & _COMMUNICATION_SPANS:
        return True
    # one process of a one-process job: no peer to wait for or send to. An unknown world size
    # is not assumed to be 1 (ranks may be missing from the trace); a MirroredStrategy's
    # replicas in that one process do communicate
    if trace.world_size != 1 or len(trace.ranks) != 1:
        return False
    span = next(iter(trace.ranks.values())).step_span
    replicas = as_int(span.attributes.get(ATTR_STEP_REPLICAS)) if span is not None else None
    return replicas is None or replicas < 2


def measured_categories(trace: StepTrace) -> FrozenSet[str]:
    """The path categories this step's spans measured (see the module docstring)."""
    categories = frozenset(map(_CATEGORY, trace.spans)) | trace.other_categories
    measured = set(ALWAYS_MEASURED)
    if _input_measured(trace, categories):
        measured.add(PATH_INPUT)
    elif _no_tf_data(trace):
        measured.add(NO_TF_DATA)
    if _communication_measured(trace, categories):
        measured.update((PATH_COMMUNICATION, PATH_STRAGGLER_WAIT))
    return frozenset(measured)


def not_measured(measured: FrozenSet[str]) -> Dict[str, str]:
    """Category -> the setting that measures it, for the categories missing from ``measured``
    (in report order)."""
    reasons = {c: SETTINGS[c] for c in PATH_CATEGORIES if c not in measured and c in SETTINGS}
    if NO_TF_DATA in measured and PATH_INPUT in reasons:
        reasons[PATH_INPUT] = NO_TF_DATA_TEXT
    return reasons


def settings_text(
    categories: Iterable[str], reasons: Optional[Mapping[str, Optional[str]]] = None
) -> str:
    """'input (TF_OTEL_INPUT_WAIT=1 ...); communication, straggler_wait (TF_OTEL_HOROVOD...)':
    categories grouped by the setting that measures them (``reasons``: a category's own
    text where it has one, e.g. ``CategoryShare.setting``)."""
    groups: Dict[str, List[str]] = {}
    for category in categories:
        reason = (reasons or {}).get(category) or SETTINGS.get(category, "")
        groups.setdefault(reason, []).append(category)
    return "; ".join(
        ", ".join(names) + (f" ({setting})" if setting else "") for setting, names in groups.items()
    )


@dataclass(frozen=True)
class CategoryShare:
    """One category (or group, e.g. communication + straggler_wait) over the steady steps."""

    categories: Tuple[str, ...]
    steps: int  # steady steps
    measured_steps: int  # of those, where every one of ``categories`` was measured
    ns: int  # their time on the path, over the measured steps
    path_ns: int  # the path's length over the measured steps
    # compute: the categories it holds on some steps (not measured there), and on how many
    holds: Tuple[str, ...] = ()
    holds_steps: int = 0
    no_tf_data_steps: int = 0  # of the steps not measured, those with no tf.data input seen

    @property
    def measured(self) -> bool:
        return self.measured_steps > 0

    @property
    def share(self) -> Optional[float]:
        """Of the path over the measured steps; None: measured on no step."""
        if not self.measured_steps:
            return None
        return self.ns / self.path_ns if self.path_ns else 0.0

    @property
    def setting(self) -> Optional[str]:
        """What measures the category on the steps where it was not; None where it always was."""
        if self.measured_steps == self.steps:
            return None
        if self.no_tf_data_steps == self.steps - self.measured_steps:
            return NO_TF_DATA_TEXT
        return "; ".join(dict.fromkeys(SETTINGS[c] for c in self.categories if c in SETTINGS))


def group_share(steps: Sequence[StepSplit], categories: Sequence[str]) -> CategoryShare:
    """``categories`` together, over the steps where every one of them was measured."""
    ns = path_ns = measured_steps = no_tf_data = 0
    for split, measured in steps:
        if all(c in measured for c in categories):
            measured_steps += 1
            ns += sum(split[c] for c in categories)
            path_ns += sum(split.values())
        elif NO_TF_DATA in measured and tuple(categories) == (PATH_INPUT,):
            no_tf_data += 1
    return CategoryShare(
        tuple(categories), len(steps), measured_steps, ns, path_ns, no_tf_data_steps=no_tf_data
    )


def category_shares(steps: Sequence[StepSplit]) -> Dict[str, CategoryShare]:
    """Every path category's share (report order); compute names what it holds."""
    shares = {c: group_share(steps, (c,)) for c in PATH_CATEGORIES}
    held = [measured for _, measured in steps if not_measured(measured)]
    holds = tuple(c for c in PATH_CATEGORIES if c in SETTINGS and any(c not in m for m in held))
    compute = shares[PATH_COMPUTE]
    shares[PATH_COMPUTE] = CategoryShare(
        compute.categories,
        compute.steps,
        compute.measured_steps,
        compute.ns,
        compute.path_ns,
        holds,
        len(held),
        compute.no_tf_data_steps,
    )
    return shares


def holds_text(holds: Iterable[str]) -> str:
    """'input wait and communication' for what compute holds."""
    names = []
    for category in holds:
        name = {PATH_INPUT: "input wait", PATH_STRAGGLER_WAIT: ""}.get(category, category)
        if name:
            names.append(name)
    return " and ".join(names) if names else "what was not measured"


def cause_label(category: str, measured: FrozenSet[str]) -> str:
    """A straggler's cause as the reports print it: ``compute`` where the step did not measure
    input or communication holds them too, marked ``compute+``."""
    return category + "+" if category == PATH_COMPUTE and not_measured(measured) else category
