"""Settings read once from the environment (TF_OTEL_*; OTEL_* are left to the SDK).

A bad value never stops the job: it is reported in one log line naming the variable and the value,
and the default is used instead.

Variables: TF_OTEL_ENABLED, TF_OTEL_JOB_ID, TF_OTEL_ATTEMPT (this launch of the job,
tf_otel/job/topology.py), TF_OTEL_FILE, TF_OTEL_FILE_FLUSH_S (the file is written at least this
often; default 0.5), TF_OTEL_ROOT_WAIT_MS, TF_OTEL_MAX_QUEUE, TF_OTEL_OPS_EVERY,
TF_OTEL_COORDINATOR, TF_OTEL_STEP_FUNCTIONS,
TF_OTEL_TEST_CLOCK (test only; "<rank>:<skew_ns>:<drift_ppm>", several joined by ","; read by
tf_otel.clock directly), TF_OTEL_CLOCK_INTERVAL_S, TF_OTEL_GPU_METRICS_INTERVAL_S,
TF_OTEL_INPUT_WAIT (every step's wait on tf.data, instrument/input_wait.py; unset, the default:
on for Keras fit / evaluate / predict and datasets iterated inside a tf.function; 1: also every
other iterator made from a dataset, which then cannot be checkpointed; 0: off),
TF_OTEL_SYSTEM_METRICS_INTERVAL_S (host/process metrics with OTel semconv names; 0: off),
TF_OTEL_RESOURCES_EVERY (peak RSS, per-file I/O and the GPU allocator peak on steps 0, N, 2N ...
of every step key; 0, the default: off; instrument/step_detail.py),
TF_OTEL_JOB_SECRET (the same random value on every rank: authenticates the cross-rank channel;
see tf_otel.job.job_secret for what is used without it),
TF_OTEL_HOROVOD_EVERY (collective detail on 1 sampled step in N, picked by the step trace id so
every rank picks the same steps; 1: every sampled step; 0: none; default 20: detail steps run a
twin of the step's function with the timing ops, other steps the program's own graph; it
applies to tf.distribute's collectives too), TF_OTEL_COLLECTIVE_EVERY (the same, under a name
for any job's collectives; where both are set, it wins),
TF_OTEL_HOROVOD_SOURCE (``stamps``, the default: every rank times its own collectives;
``timeline``: Horovod's DYNAMIC timeline on rank 0, which costs a spinning thread from hvd.init),
TF_OTEL_HOROVOD_PARTS (1: a collective whose rank waited >= 1 ms for the last one gets
``wait`` and ``transfer`` children; 0: one span per collective, its wait in ``horovod.wait_ns``,
which the analysis reads as well: about half the spans of a detail step; unset: 1 when
TF_OTEL_HOROVOD_EVERY >= 10, 0 for denser detail, where the children's export costs 4 % of
MobileNetV2's throughput),
TF_OTEL_TWIN_PREPARE (``background``, the default: a detail twin is traced and instantiated on a
thread of its own and runs from the first picked step it is ready for on every rank;
``step``: on the step that traced the program's function, so every picked step is detailed;
instrument/twin.py),
TF_OTEL_HOROVOD_FUSED (1: one collective span per group of tensors that completed together,
Horovod's fused responses as rank 0's own ends tell them; unset: 1 for detail on 1 step in
fewer than 10, where span volume is what detail costs; 0: one span per tensor),
TF_OTEL_STALL (rank 0's stall watch, pipeline/stall.py; default 1; 0: off),
TF_OTEL_STALL_FLOOR_S and TF_OTEL_STALL_FACTOR (a step of rank 0 in flight longer than
max(floor, factor x the median of the key's recent steps) is a stall; defaults 20 s and 10,
docs/guides/RELIABILITY.md "Stalls" says why),
TF_OTEL_VERDICTS (rank 0's live verdict on each step root, the per-rank lateness histogram and
persistent slowdowns, pipeline/verdicts.py; default 1; 0: off),
TF_OTEL_HOST_RELAY (one rank a host gathers the host's step reports for rank 0,
pipeline/host_relay.py; default 1: on where a host runs several ranks, not on rank 0's own
host; 0: every rank to rank 0),
TF_OTEL_BASELINE (a saved ``tf-otel analyze --format json`` report: rank 0 compares each window
of steps with it, pipeline/baseline.py; unset: off).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Tuple, TypeVar

from tf_otel.health import log_once

T = TypeVar("T")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")
HOROVOD_EVERY_DEFAULT = 20  # detail-step twin: ~7 % on a detail step, so ~0.4 % a step
# a step < 1 s is named stalled <= 20 s + 1 s (check) + 2 s (answers) after it began: within the
# 30 s the issue asks; 10x the median keeps a legitimately slow step (3x, 5x) from ever raising
STALL_FLOOR_S_DEFAULT = 20.0
STALL_FACTOR_DEFAULT = 10.0


class ConfigError(ValueError):
    """A setting that cannot be used; the message names the variable and the value."""


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError("expected one of 1/true/yes/on or 0/false/no/off")


def _int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError("expected an integer") from None


def _float(text: str) -> float:
    try:
        return float(text.strip())
    except ValueError:
        raise ValueError("expected a number") from None


def _non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise ValueError("expected an integer >= 0")
    return value


def _positive_float(text: str) -> float:
    value = _float(text)
    if not value > 0:
        raise ValueError("expected a number > 0")
    return value


def _non_negative_float(text: str) -> float:
    value = _float(text)
    if not value >= 0:
        raise ValueError("expected a number >= 0")
    return value


def _host_port(text: str) -> Tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("expected HOST:PORT")
    return host, int(port)


def _horovod_source(text: str) -> str:
    value = text.strip().lower()
    if value not in ("stamps", "timeline"):
        raise ValueError("expected stamps or timeline")
    return value


def _twin_prepare(text: str) -> str:
    value = text.strip().lower()
    if value not in ("background", "step"):
        raise ValueError("expected background or step")
    return value


def _port(text: str) -> int:
    value = _int(text)
    if not 0 <= value < 65536:
        raise ValueError("expected a port 0-65535 (0: any free port)")
    return value


def _directory(text: str) -> str:
    value = text.strip()
    if not value or not os.path.isdir(value):
        raise ValueError("expected an existing directory")
    return value


def _names(text: str) -> Tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


def read(env: Mapping[str, str], name: str, parse: Callable[[str], T], default: T) -> T:
    """Parse ``env[name]``; on a bad value log one clear line and return ``default``."""
    raw = env.get(name)
    if raw is None:
        return default
    try:
        return parse(raw)
    except (ValueError, TypeError) as exc:
        log_once(
            "config:" + name,
            "tf_otel: ignoring %s=%r (%s); using the default %r",
            name,
            raw,
            exc,
            default,
        )
        return default


@dataclass(frozen=True)
class Settings:
    enabled: bool = False
    job_id: Optional[str] = None
    # this launch of the job, the same on every rank (job/topology.py, launch_attempt)
    attempt: Optional[str] = None
    file: Optional[str] = None
    root_wait_ms: float = 3000.0
    max_queue: int = 4096
    ops_every: int = 0
    coordinator: Optional[Tuple[str, int]] = None
    step_functions: Tuple[str, ...] = ()
    test_clock: Optional[str] = None
    clock_interval_s: float = 60.0
    gpu_metrics_interval_s: float = 10.0  # 0: off
    # every step's wait on tf.data (instrument/input_wait.py): None (unset), on for the
    # iterators Keras fit / evaluate / predict make and datasets iterated inside a tf.function;
    # True, also every other iterator (a user's iterator, whose checkpoints then fail); False, off
    input_wait: Optional[bool] = None
    system_metrics_interval_s: float = 10.0  # host/process semconv metrics; 0: off
    # peak RSS, per-file I/O and the GPU allocator peak on steps 0, N, 2N ...; 0: off
    resources_every: int = 0
    # collective detail on 1 sampled step in N; 0: off (docs/guides/HOROVOD.md: why 20)
    horovod_every: int = HOROVOD_EVERY_DEFAULT
    horovod_source: str = "stamps"  # or "timeline"
    # detail twins prepared on a background thread, from the first picked step ready on every
    # rank ("background"), or on the step that traced the program's function ("step")
    twin_prepare: str = "background"
    # wait / transfer children under a collective that waited >= 1 ms; None: on when detail is
    # on 1 step in PARTS_DENSE_EVERY or fewer, off for denser detail (half the spans)
    horovod_parts: Optional[bool] = None
    # one collective span per group of tensors that completed together (Horovod's fused
    # responses); None: on when detail is on 1 step in fewer than PARTS_DENSE_EVERY
    horovod_fused: Optional[bool] = None
    # authenticates rank <-> rank 0 (tf_otel.job.job_secret); never in a repr or a log line
    job_secret: Optional[str] = field(default=None, repr=False)
    file_max_mb: float = 1024.0  # TF_OTEL_FILE rotates past this size; 0: no cap
    file_keep: int = 3  # rotated files kept beside TF_OTEL_FILE
    # TF_OTEL_FILE is written at least this often: a killed process loses about this much
    # (and the export thread's half second) of spans
    file_flush_s: float = 0.5
    exit_timeout_s: float = 5.0  # the exit flush gives up on a silent exporter after this
    horovod: bool = True  # Horovod collectives on step traces
    horovod_exact: bool = False  # HOROVOD_CACHE_CAPACITY=0: per-rank ready ticks every step
    max_op_spans: int = 500  # op spans per traced step
    ops_margin: int = 3  # steps between an on-demand decision and its first traced step
    ops_margin_s: float = 0.5
    ops_signal_steps: int = 10  # steps traced per SIGUSR2
    admin_port: Optional[int] = None  # on-demand op tracing endpoint (rank 0, 127.0.0.1)
    admin_token: Optional[str] = field(default=None, repr=False)
    nccl_profiler: bool = False  # point NCCL_PROFILER_PLUGIN at tf_otel's plugin
    nccl_ring_dir: str = "/dev/shm"
    analyze_workers: int = 0  # tf-otel analyze processes; 0: one per usable CPU
    # rank 0's stall watch (pipeline/stall.py): a step in flight longer than
    # max(stall_floor_s, stall_factor x median of the key's recent steps) is reported
    stall: bool = True
    stall_floor_s: float = STALL_FLOOR_S_DEFAULT
    stall_factor: float = STALL_FACTOR_DEFAULT
    verdicts: bool = True  # rank 0's live verdicts (pipeline/verdicts.py)
    # a saved tf-otel analyze JSON report rank 0 compares each window of steps with
    # (pipeline/baseline.py)
    baseline: Optional[str] = None
    # one relay a host for the step reports (pipeline/host_relay.py): on where a host runs
    # several ranks (not rank 0's own host); False: every rank to rank 0
    host_relay: bool = True

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> Settings:
        env = os.environ if env is None else env
        warn_unknown(env)
        return cls(
            enabled=read(env, "TF_OTEL_ENABLED", _bool, False),
            job_id=(env.get("TF_OTEL_JOB_ID") or "").strip() or None,
            attempt=(env.get("TF_OTEL_ATTEMPT") or "").strip() or None,
            file=(env.get("TF_OTEL_FILE") or "").strip() or None,
            root_wait_ms=read(env, "TF_OTEL_ROOT_WAIT_MS", _positive_float, 3000.0),
            max_queue=max(16, read(env, "TF_OTEL_MAX_QUEUE", _non_negative_int, 4096)),
            ops_every=read(env, "TF_OTEL_OPS_EVERY", _non_negative_int, 0),
            coordinator=read(env, "TF_OTEL_COORDINATOR", _host_port, None),
            step_functions=read(env, "TF_OTEL_STEP_FUNCTIONS", _names, ()),
            test_clock=(env.get("TF_OTEL_TEST_CLOCK") or "").strip() or None,
            clock_interval_s=read(env, "TF_OTEL_CLOCK_INTERVAL_S", _positive_float, 60.0),
            gpu_metrics_interval_s=read(
                env, "TF_OTEL_GPU_METRICS_INTERVAL_S", _non_negative_float, 10.0
            ),
            input_wait=read(env, "TF_OTEL_INPUT_WAIT", _bool, None),
            resources_every=read(env, "TF_OTEL_RESOURCES_EVERY", _non_negative_int, 0),
            system_metrics_interval_s=read(
                env, "TF_OTEL_SYSTEM_METRICS_INTERVAL_S", _non_negative_float, 10.0
            ),
            job_secret=(env.get("TF_OTEL_JOB_SECRET") or "").strip() or None,
            horovod_every=read(  # the neutral name wins: it names tf.distribute's too
                env,
                "TF_OTEL_COLLECTIVE_EVERY",
                _non_negative_int,
                read(env, "TF_OTEL_HOROVOD_EVERY", _non_negative_int, HOROVOD_EVERY_DEFAULT),
            ),
            file_max_mb=read(env, "TF_OTEL_FILE_MAX_MB", _non_negative_float, 1024.0),
            file_keep=read(env, "TF_OTEL_FILE_KEEP", _non_negative_int, 3),
            file_flush_s=read(env, "TF_OTEL_FILE_FLUSH_S", _positive_float, 0.5),
            exit_timeout_s=read(env, "TF_OTEL_EXIT_TIMEOUT_S", _non_negative_float, 5.0),
            horovod=read(env, "TF_OTEL_HOROVOD", _bool, True),
            horovod_exact=read(env, "TF_OTEL_HOROVOD_EXACT", _bool, False),
            max_op_spans=read(env, "TF_OTEL_MAX_OP_SPANS", _non_negative_int, 500),
            ops_margin=read(env, "TF_OTEL_OPS_MARGIN", _non_negative_int, 3),
            ops_margin_s=read(env, "TF_OTEL_OPS_MARGIN_S", _positive_float, 0.5),
            ops_signal_steps=read(env, "TF_OTEL_OPS_SIGNAL_STEPS", _non_negative_int, 10),
            admin_port=read(env, "TF_OTEL_ADMIN_PORT", _port, None),
            admin_token=(env.get("TF_OTEL_ADMIN_TOKEN") or "").strip() or None,
            nccl_profiler=read(env, "TF_OTEL_NCCL_PROFILER", _bool, False),
            nccl_ring_dir=read(env, "TF_OTEL_NCCL_RING_DIR", _directory, "/dev/shm"),
            analyze_workers=read(env, "TF_OTEL_ANALYZE_WORKERS", _non_negative_int, 0),
            horovod_source=read(env, "TF_OTEL_HOROVOD_SOURCE", _horovod_source, "stamps"),
            twin_prepare=read(env, "TF_OTEL_TWIN_PREPARE", _twin_prepare, "background"),
            horovod_parts=read(env, "TF_OTEL_HOROVOD_PARTS", _bool, None),
            horovod_fused=read(env, "TF_OTEL_HOROVOD_FUSED", _bool, None),
            stall=read(env, "TF_OTEL_STALL", _bool, True),
            stall_floor_s=read(
                env, "TF_OTEL_STALL_FLOOR_S", _positive_float, STALL_FLOOR_S_DEFAULT
            ),
            stall_factor=read(env, "TF_OTEL_STALL_FACTOR", _positive_float, STALL_FACTOR_DEFAULT),
            verdicts=read(env, "TF_OTEL_VERDICTS", _bool, True),
            baseline=(env.get("TF_OTEL_BASELINE") or "").strip() or None,
            host_relay=read(env, "TF_OTEL_HOST_RELAY", _bool, True),
        )


# Every TF_OTEL_* variable tf_otel reads (the README's settings table is checked against it).
VARIABLES = (
    "TF_OTEL_ENABLED",
    "TF_OTEL_JOB_ID",
    "TF_OTEL_ATTEMPT",
    "TF_OTEL_JOB_SECRET",
    "TF_OTEL_FILE",
    "TF_OTEL_FILE_MAX_MB",
    "TF_OTEL_FILE_KEEP",
    "TF_OTEL_FILE_FLUSH_S",
    "TF_OTEL_EXIT_TIMEOUT_S",
    "TF_OTEL_ROOT_WAIT_MS",
    "TF_OTEL_MAX_QUEUE",
    "TF_OTEL_COORDINATOR",
    "TF_OTEL_STEP_FUNCTIONS",
    "TF_OTEL_OPS_EVERY",
    "TF_OTEL_MAX_OP_SPANS",
    "TF_OTEL_OPS_MARGIN",
    "TF_OTEL_OPS_MARGIN_S",
    "TF_OTEL_OPS_SIGNAL_STEPS",
    "TF_OTEL_ADMIN_PORT",
    "TF_OTEL_ADMIN_TOKEN",
    "TF_OTEL_HOROVOD",
    "TF_OTEL_HOROVOD_EXACT",
    "TF_OTEL_HOROVOD_EVERY",
    "TF_OTEL_COLLECTIVE_EVERY",
    "TF_OTEL_HOROVOD_SOURCE",
    "TF_OTEL_HOROVOD_PARTS",
    "TF_OTEL_HOROVOD_FUSED",
    "TF_OTEL_TWIN_PREPARE",
    "TF_OTEL_CLOCK_INTERVAL_S",
    "TF_OTEL_GPU_METRICS_INTERVAL_S",
    "TF_OTEL_INPUT_WAIT",
    "TF_OTEL_RESOURCES_EVERY",
    "TF_OTEL_SYSTEM_METRICS_INTERVAL_S",
    "TF_OTEL_NCCL_PROFILER",
    "TF_OTEL_NCCL_RING_DIR",
    "TF_OTEL_ANALYZE_WORKERS",
    "TF_OTEL_STALL",
    "TF_OTEL_STALL_FLOOR_S",
    "TF_OTEL_STALL_FACTOR",
    "TF_OTEL_HOST_RELAY",
    "TF_OTEL_BASELINE",
    "TF_OTEL_TEST_CLOCK",
)
# read elsewhere, never by this package: the install/build scripts, the NCCL profiler plugin (C),
# the collector configs, the simulated cluster and the test suite
SCRIPT_VARIABLES = (
    "TF_OTEL_CACHE",
    "TF_OTEL_JAEGER_BIN",
    "TF_OTEL_COLLECTOR_BIN",
    "TF_OTEL_NCCL_CHILD_EVENTS",
    "TF_OTEL_NCCL_RING_RECORDS",
    "TF_OTEL_TAIL_DECISION_WAIT",
    "TF_OTEL_TAIL_SLOW_STEP_MS",
    "TF_OTEL_TAIL_BASELINE_PERCENT",
    "TF_OTEL_CLUSTER_HOST",
)


def warn_unknown(env: Mapping[str, str]) -> None:
    """A TF_OTEL_* name tf_otel does not know is a typo that would be silently ignored: say so."""
    import difflib

    for name in env:
        if name.startswith("TF_OTEL_") and name not in VARIABLES + SCRIPT_VARIABLES:
            close = difflib.get_close_matches(name, VARIABLES, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            log_once(
                "config_unknown:" + name,
                "tf_otel: unknown setting %s=%r is ignored%s",
                name,
                env[name],
                hint,
            )


_current: Optional[Settings] = None


def use(settings: Settings) -> Settings:
    """Make ``settings`` this process's settings: ``tf_otel.instrument()`` reads the environment
    once, hands them to every ``register(settings)`` and keeps them here for what runs later."""
    global _current
    _current = settings
    return settings


def current() -> Settings:
    """This process's settings: those ``use`` was given, else read from the environment once
    (the command-line tools)."""
    global _current
    if _current is None:
        _current = Settings.from_env()
    return _current
