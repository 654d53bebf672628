"""The one record type every source produces, and the names of the trace contract.

Sources make ``Record``s with LOCAL ``time.time_ns()``-domain times; ``runtime.steps`` maps them
to reference time and turns them into spans. See docs/ARCHITECTURE.md, "The trace contract".
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, Optional


class Category(str, Enum):
    """The ``tf_otel.category`` values, the runtime's and the analysis' one definition."""

    JOB = "job"
    STEP_ROOT = "step.root"
    STEP = "step"
    COMPUTE = "compute"
    INPUT = "input"
    COLLECTIVE = "collective"
    COLLECTIVE_WAIT = "collective.wait"
    COLLECTIVE_TRANSFER = "collective.transfer"
    TRANSFER = "transfer"
    KERNEL = "kernel"
    FRAMEWORK = "framework"
    STALL = "stall"  # rank 0's stall record in a step's trace (cluster/stall.py)
    SLOWDOWN = "slowdown"  # rank 0's persistent slowdown record (cluster/verdicts.py)

    # as text, a member is its value (str(), f-strings), as enum.StrEnum does from Python 3.11
    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(self, spec)


# The values as plain str, which is what records, span attributes and the analysis' rows hold:
# the exporter's fast path takes exact types only (span_builder._plain), marshal takes no str
# subclass, and the analysis' hot comparisons are quickest between exact str. Spelled out, not
# made in a loop, so that type checkers see each name.
JOB = Category.JOB.value
STEP_ROOT = Category.STEP_ROOT.value
STEP = Category.STEP.value
COMPUTE = Category.COMPUTE.value
INPUT = Category.INPUT.value
COLLECTIVE = Category.COLLECTIVE.value
COLLECTIVE_WAIT = Category.COLLECTIVE_WAIT.value
COLLECTIVE_TRANSFER = Category.COLLECTIVE_TRANSFER.value
TRANSFER = Category.TRANSFER.value
KERNEL = Category.KERNEL.value
FRAMEWORK = Category.FRAMEWORK.value
STALL = Category.STALL.value
SLOWDOWN = Category.SLOWDOWN.value

# attribute keys
ATTR_CATEGORY = "tf_otel.category"
ATTR_RANK = "tf_otel.rank"
ATTR_WORLD_SIZE = "tf_otel.world_size"
# the ranks that run steps, where not all do (a parameter-server job: its ps tasks run none)
ATTR_STEP_WORLD_SIZE = "tf_otel.step_world_size"
ATTR_LOCAL_RANK = "tf_otel.local_rank"
ATTR_JOB_ID = "tf_otel.job.id"
# one launch of the job (job/topology.py, launch_attempt): step trace ids differ between attempts
ATTR_JOB_ATTEMPT = "tf_otel.job.attempt"
ATTR_JOB_PREVIOUS_ATTEMPT = "tf_otel.job.previous_attempt"  # the job span: the attempt before
# a world that changed while the job ran (Horovod Elastic, cluster/world.py): the event
# WORLD_CHANGE on the first step root of the new world and on the job span
WORLD_CHANGE = "tf_otel.world.change"
ATTR_WORLD_BEFORE = "tf_otel.world.before"
ATTR_WORLD_AFTER = "tf_otel.world.after"
ATTR_WORLD_LEFT = "tf_otel.world.left"  # ranks (numbered in the old world) that left
ATTR_WORLD_JOINED = "tf_otel.world.joined"
# a root's: the ranks of the world that ran its step, where they are not 0..n-1 (a process keeps
# the rank it began with when Horovod renumbers the survivors of a rank other than the last)
ATTR_STEP_WORLD_RANKS = "tf_otel.step.world_ranks"
# a run resumed from a checkpoint (Keras BackupAndRestore): the job span and its first step
ATTR_RESUMED_EPOCH = "tf_otel.resumed.epoch"
ATTR_RESUMED_STEP = "tf_otel.resumed.step"
ATTR_LAUNCHER = "tf_otel.launcher"
ATTR_STEP = "tf_otel.step"
ATTR_STEP_KIND = "tf_otel.step.kind"
ATTR_STEP_BATCHES = "tf_otel.step.batches"
ATTR_STEP_RANKS = "tf_otel.step.ranks"
ATTR_CLOCK_OFFSET = "tf_otel.clock.offset_ns"
ATTR_CLOCK_UNCERTAINTY = "tf_otel.clock.uncertainty_ns"
ATTR_COLLECTIVE_KEY = "tf_otel.collective.key"
ATTR_FUNCTION_NAME = "tensorflow.function.name"
ATTR_HOST_NAME = "host.name"  # semantic conventions (resource)

# collectives (sources.horovod_timeline, sources.horovod_stamp_records)
ATTR_TENSOR = "horovod.tensor"
ATTR_LAST_ARRIVAL = "horovod.last_arrival"
ATTR_ARRIVAL = "horovod.arrival"  # how a rank's arrival is known: tick|negotiate|inferred|unknown
ATTR_WAIT_NS = "horovod.wait_ns"
# a collective of several replicas in one process (MirroredStrategy): its span is the process's,
# from its last replica's arrival; which replica came last and by how much after the first
ATTR_REPLICAS = "tf_otel.replicas"
# on a sampled step span: the devices of this process's MirroredStrategy (> 1), which
# communicate with each other even in a one-process job
ATTR_STEP_REPLICAS = "tf_otel.step.replicas"
ATTR_REPLICA_LAST = "tf_otel.replica.last"
ATTR_REPLICA_SPREAD_NS = "tf_otel.replica.spread_ns"
# parameter-server transfers (sources.step_stats)
ATTR_TRANSFER_EDGE = "tensorflow.transfer.edge"
# the older per-span GPU sample, still read in traces of earlier versions (analysis.gpu)
ATTR_GPU_UTILIZATION = "gpu.utilization"

# step span attributes the whole-step rules read
ATTR_INPUT_WAIT = "tf_otel.input.wait_ns"  # instrument.input_wait
ATTR_INPUT_ELEMENTS = "tf_otel.input.elements"
# False on a sampled step of a process that has iterated no tf.data dataset so far (the
# input-wait hooks saw none): its input is not a pipeline there is anything to measure of
ATTR_INPUT_SEEN = "tf_otel.input.tf_data_seen"
ATTR_BETWEEN = "tf_otel.between_steps_ns"  # instrument.step_resources
ATTR_CALLBACK = "tf_otel.between_steps.callback_ns"
ATTR_CHECKPOINT = "tf_otel.between_steps.checkpoint_ns"
ATTR_TOP = "tf_otel.between_steps.top"
ATTR_READ_BYTES = "tf_otel.io.read_bytes"
ATTR_READ_OPS = "tf_otel.io.read_ops"
ATTR_CPU_TIME = "tf_otel.process.cpu_time_ns"
ATTR_CPUS = "tf_otel.process.cpus"
ATTR_MEMORY = "process.memory.usage"  # semantic conventions
ATTR_HW_GPU_UTILIZATION = "hw.gpu.utilization"  # semantic conventions (ratio 0..1)
ATTR_BATCH_SIZE = "tf_otel.batch.size"  # instrument.keras
# what tf_otel itself did in the step beyond its step span ("ops", "resources"): its own
# reads, CPU and memory are in that step's process counters (instrument.ops, step_detail)
ATTR_DETAIL = "tf_otel.detail"
# a picked collective-detail step that ran the program's own function: its detail twin was not
# yet prepared on every rank (instrument/detail_twin.py); value DETAIL_TWIN_PREPARING
ATTR_DETAIL_TWIN = "tf_otel.detail.twin"
DETAIL_TWIN_PREPARING = "preparing"

# a rank's step span exported while the step still runs (a stall, SIGTERM or exit mid-step)
ATTR_STEP_IN_FLIGHT = "tf_otel.step.in_flight"
ATTR_STEP_IN_FLIGHT_REASON = "tf_otel.step.in_flight_reason"  # "stall" or "exit"
ATTR_STEP_STACK = "tf_otel.step.stack"  # its training thread's frames then, innermost first
# the stall record (category STALL, cluster/stall.py): a span in the step's trace + a log record
ATTR_STEP_KEY = "tf_otel.step.key"
ATTR_STALL_STATE = "tf_otel.stall.state"  # STALLED while it lasts, RESOLVED once the step ended
ATTR_STALL_DURATION = "tf_otel.stall.duration_ns"  # rank 0's step in flight so far / in all
ATTR_STALL_THRESHOLD = "tf_otel.stall.threshold_ns"
ATTR_STALL_REPORT = "tf_otel.stall.report"  # 1, 2, 3 ... (repeated with back-off)
ATTR_STALL_MISSING = "tf_otel.stall.ranks_missing"  # ranks that have not reached the step
ATTR_STALL_WAITING = "tf_otel.stall.ranks_waiting"  # ranks inside the step (waiting)
ATTR_STALL_SILENT = "tf_otel.stall.ranks_silent"  # ranks that did not answer rank 0
ATTR_STALL_BLOCKED_IN = "tf_otel.stall.blocked_in"  # where the waiting ranks are, by place
ATTR_STALL_RANKS = "tf_otel.stall.ranks"  # one line per rank: where it is, since when
ATTR_STALL_STACKS = "tf_otel.stall.stacks"  # one entry per answering rank: its training stack
# the collectives built into the waiting ranks' step ("allreduce <name>"; the first few), and
# how many it holds; none can have completed where a rank has not begun the step
ATTR_STALL_COLLECTIVES = "tf_otel.stall.collectives"
ATTR_STALL_COLLECTIVE_COUNT = "tf_otel.stall.collective_count"
# rank 0's stall of a step it has not begun itself (it stopped between steps)
ATTR_STALL_RANK0_BETWEEN = "tf_otel.stall.rank0_between_steps"
STALLED = "stalled"
RESOLVED = "resolved"
# rank 0's live verdict on a step root (cluster/verdicts.py, the offline analysis' noise model)
ATTR_STRAGGLER_RANK = "tf_otel.straggler.rank"  # the rank that held the step (absent: nobody)
ATTR_STRAGGLER_LATENESS = "tf_otel.straggler.lateness_ns"
ATTR_STRAGGLER_CATEGORY = "tf_otel.straggler.category"  # before_step / input / compute
ATTR_STRAGGLER_THRESHOLD = "tf_otel.straggler.threshold_ns"  # the run's noise, this step
ATTR_STRAGGLER_MEASURED = "tf_otel.straggler.measured"  # judged from: arrivals / extents
# a persistent slowdown (category SLOWDOWN): a span + a log record where it began and ended
ATTR_SLOWDOWN_STATE = "tf_otel.slowdown.state"  # BEGAN / ENDED
ATTR_SLOWDOWN_RANK = "tf_otel.slowdown.rank"  # absent: the whole step time slowed down
ATTR_SLOWDOWN_SINCE = "tf_otel.slowdown.since_step"
ATTR_SLOWDOWN_AT = "tf_otel.slowdown.at_step"  # the step rank 0 raised (or closed) it at
ATTR_SLOWDOWN_LATENESS = "tf_otel.slowdown.lateness_ns"  # its median while it lasted
ATTR_SLOWDOWN_THRESHOLD = "tf_otel.slowdown.threshold_ns"
BEGAN = "began"
ENDED = "ended"

# tf_otel.step.kind values
SESSION_RUN = "session_run"
KERAS_TRAIN = "keras_train"
KERAS_EVALUATE = "keras_evaluate"
KERAS_PREDICT = "keras_predict"
TF_FUNCTION = "tf_function"

_ids = itertools.count(1)


def new_record_id() -> int:
    return next(_ids)


@dataclass
class Record:
    """One timed thing on one rank, in local clock time (ns since the Unix epoch)."""

    name: str
    start_ns: int
    end_ns: int
    category: str
    step: Optional[int] = None
    attributes: Dict[str, Any] = field(default_factory=dict)
    record_id: int = field(default_factory=new_record_id)
    # None: child of this rank's step span; otherwise the record_id of another Record of the step.
    parent_id: Optional[int] = None
