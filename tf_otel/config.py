"""tf_otel's settings: the TF_OTEL_* variables, read once from the environment at start-up.

Each field of ``Settings`` is one setting, declared once with ``setting(variable, parser,
default, doc)``; ``from_env``, the unknown-name check, ``tf-otel settings`` and the README's table
(``make settings-table``) all read that declaration. A bad value never stops the job: one log
line names the variable and the value, and the default is used. OTEL_* are left to the SDK.

Usage::

    settings = config.use(Settings.from_env())   # instrument(); then register(settings)
    for spec in SPECS: print(spec.variables, spec.shown, spec.doc)
"""

from __future__ import annotations

import difflib
import os
from dataclasses import Field, dataclass, field, fields
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, TypeVar

from tf_otel import setting_parsers as parse
from tf_otel.health import log_once

T = TypeVar("T")
_SPEC = "tf_otel.setting"  # the key of a field's metadata that holds its declaration
HOROVOD_EVERY_DEFAULT = 20  # detail-step twin: ~7 % on a detail step, so ~0.4 % a step


def setting(
    variable: str,
    parse: Callable[[str], T],
    default: T,
    doc: str,
    *,
    shown: str = "",
    also: Tuple[str, ...] = (),
    secret: bool = False,
) -> T:
    """A field of ``Settings`` read from ``variable`` (then ``also``: a later one that is set
    wins) by ``parse``; ``shown``: the default as the docs say it, where its value does not;
    ``secret``: never in a repr, a log line or ``tf-otel settings``."""
    declared = dict(variables=(variable,) + also, parse=parse, doc=doc, shown=shown, secret=secret)
    return field(default=default, repr=not secret, metadata={_SPEC: declared})


@dataclass(frozen=True)
class Settings:
    """Every TF_OTEL_* setting; the order is the README's."""

    enabled: bool = setting(
        "TF_OTEL_ENABLED",
        parse.flag,
        False,
        "trace every Python process started with it (ranks under any launcher)",
    )
    job_id: Optional[str] = setting(
        "TF_OTEL_JOB_ID",
        parse.text,
        None,
        "the job id all ranks share (set it when the launcher gives none); replaces only the id: "
        "rank and world size still come from the launcher, TF_CONFIG or the program's "
        "`tf.distribute.Server`",
        shown="from the launcher",
    )
    attempt: Optional[str] = setting(
        "TF_OTEL_ATTEMPT",
        parse.text,
        None,
        "this launch of the job, the same on every rank: step trace ids hash it, so a rerun or "
        "restart never shares a trace with an earlier attempt (job span: "
        "`tf_otel.job.attempt`, a link to the attempt before where it is a number). Unset: "
        "`SLURM_RESTART_COUNT` / `TORCHELASTIC_RESTART_COUNT`, mpirun's / horovodrun's launch "
        "id inside a SLURM job step, a random one for a single-worker TF_CONFIG; none where the "
        "job id is horovodrun's / mpirun's own (it differs per launch) or `TF_OTEL_JOB_ID`'s (a "
        "given id is the whole identity), nor for a job of several ranks identified by "
        'TF_CONFIG alone (docs/guides/RELIABILITY.md, "Attempts")',
        shown="from the launcher",
    )
    job_secret: Optional[str] = setting(
        "TF_OTEL_JOB_SECRET",
        parse.text,
        None,
        "per-job secret authenticating ranks to rank 0 (docs/guides/RELIABILITY.md); set it for "
        "multi-host launches that share none",
        shown="from the launcher",
        secret=True,
    )
    file: Optional[str] = setting(
        "TF_OTEL_FILE",
        parse.text,
        None,
        "also write OTLP-JSON here; `{rank}`, `{host}`, `{pid}` are filled in; opened at start "
        "(one message if it cannot be); with `{rank}` and neither a launcher nor TF_CONFIG, "
        "named at the first spans (the rank may come from the program's "
        "`tf.distribute.Server`), its directory checked at start",
        shown="none",
    )
    file_flush_s: float = setting(
        "TF_OTEL_FILE_FLUSH_S",
        parse.positive_float,
        0.5,
        "the file is written at least this often, on the span processor's thread: a rank "
        "killed by SIGKILL loses about this and the export thread's half second of spans (its "
        "last record may be cut short: `tf-otel analyze` skips it and says so)",
    )
    file_max_mb: float = setting(
        "TF_OTEL_FILE_MAX_MB",
        parse.non_negative_float,
        1024.0,
        "the file rotates past this size (`spans.jsonl` → `spans.1.jsonl` …); 0: no cap",
    )
    file_keep: int = setting(
        "TF_OTEL_FILE_KEEP",
        parse.non_negative_int,
        3,
        "rotated files kept beside it (the oldest is removed)",
    )
    exit_timeout_s: float = setting(
        "TF_OTEL_EXIT_TIMEOUT_S",
        parse.non_negative_float,
        5.0,
        "the whole exit (the last spans' export, the link to rank 0, rank 0's last roots, "
        "metrics, the SDK's flush) ends within this in all; what was lost is said in one line",
    )
    root_wait_ms: float = setting(
        "TF_OTEL_ROOT_WAIT_MS",
        parse.positive_float,
        3000.0,
        "how long rank 0 waits for all ranks before emitting a step root",
    )
    stall: bool = setting(
        "TF_OTEL_STALL",
        parse.flag,
        True,
        "rank 0 names a rank that holds a step while the job runs: a `stall` span and a WARNING "
        "log record in the step's trace, the ranks' steps in flight exported "
        '(docs/guides/RELIABILITY.md, "Stalls"); 0: off',
    )
    # a step < 1 s is named stalled <= 20 s + 1 s (check) + 2 s (answers) after it began; 10x
    # the median keeps a legitimately slow step (3x, 5x) from ever raising
    stall_floor_s: float = setting(
        "TF_OTEL_STALL_FLOOR_S",
        parse.positive_float,
        20.0,
        "a step of rank 0 in flight longer than max(this floor, `TF_OTEL_STALL_FACTOR` x the "
        "median of the key's recent steps) is a stall (6 x the floor until 3 steps of the key "
        "completed); steps < 1 s are named ≤ 23 s after they began",
    )
    stall_factor: float = setting(
        "TF_OTEL_STALL_FACTOR",
        parse.positive_float,
        10.0,
        "the factor of the median in `TF_OTEL_STALL_FLOOR_S`'s bound: a step 3x (even 9x) the "
        "median is never a stall",
    )
    max_queue: int = setting(
        "TF_OTEL_MAX_QUEUE",
        parse.queue_size,
        4096,
        "steps buffered for export (at least 16); beyond it steps are dropped and counted",
    )
    host_relay: bool = setting(
        "TF_OTEL_HOST_RELAY",
        parse.flag,
        True,
        "one rank of each host with several ranks (elected, as the clock's host leader) gathers "
        "its host's step reports and sends rank 0 one message a step and host over one "
        "connection; rank 0's broadcasts reach the host's ranks through it; when it dies another "
        "rank of the host takes over; ranks on rank 0's own host talk to it directly "
        "(docs/ARCHITECTURE.md); 0: every rank talks to rank 0",
        shown="1 (where a host runs several ranks)",
    )
    verdicts: bool = setting(
        "TF_OTEL_VERDICTS",
        parse.flag,
        True,
        "rank 0's live verdict on each step root, the per-rank lateness histogram and "
        "persistent slowdowns (cluster/verdicts.py); 0: off",
    )
    baseline: Optional[str] = setting(
        "TF_OTEL_BASELINE",
        parse.text,
        None,
        "a saved `tf-otel analyze --format json` report of a reference run: rank 0 compares "
        "every 16 steps' median step time with it, beyond the noise as `tf-otel diff` does, and "
        "marks a slower window on its step root (`tf_otel.baseline.slower`, with the rank whose "
        "lateness grew) and in the `tf_otel.step.baseline_ratio` gauge (alert "
        "`TrainingSlowerThanBaseline`)",
    )
    coordinator: Optional[Tuple[str, int]] = setting(
        "TF_OTEL_COORDINATOR",
        parse.host_port,
        None,
        "`host:port` of rank 0's tf_otel service; an override: horovodrun, mpirun, SLURM, "
        "TF_CONFIG and flag-configured `tf.distribute.Server` jobs find rank 0 alone "
        "(docs/guides/CLUSTER.md)",
        shown="rank 0's host, port from the job id",
    )
    step_functions: Tuple[str, ...] = setting(
        "TF_OTEL_STEP_FUNCTIONS",
        parse.names,
        (),
        "comma list: only these functions are steps",
        shown="all user `tf.function`s",
    )
    ops_every: int = setting(
        "TF_OTEL_OPS_EVERY",
        parse.non_negative_int,
        0,
        "op-level spans (and RecvTensor transfers) every Nth step, the same steps on every rank",
    )
    max_op_spans: int = setting(
        "TF_OTEL_MAX_OP_SPANS",
        parse.non_negative_int,
        500,
        "op spans kept per step (the longest); the rest summarised",
    )
    ops_margin: int = setting(
        "TF_OTEL_OPS_MARGIN",
        parse.non_negative_int,
        3,
        "on-demand op tracing starts at least this many steps after rank 0 decides, so every "
        "rank traces the same steps",
    )
    ops_margin_s: float = setting(
        "TF_OTEL_OPS_MARGIN_S",
        parse.positive_float,
        0.5,
        "on-demand op tracing starts at least this many seconds' worth of steps after rank 0 "
        "decides (and `TF_OTEL_OPS_MARGIN` steps), so the broadcast arrives in time",
    )
    admin_port: Optional[int] = setting(
        "TF_OTEL_ADMIN_PORT",
        parse.port,
        None,
        "rank 0's admin endpoint on 127.0.0.1 (0: any free port, logged): op-level detail for "
        "the next K steps on demand",
        shown="off",
    )
    admin_token: Optional[str] = setting(
        "TF_OTEL_ADMIN_TOKEN",
        parse.text,
        None,
        "the admin endpoint's token; unset, one is generated and written to a 0600 file, never "
        "logged",
        shown="generated",
        secret=True,
    )
    ops_signal_steps: int = setting(
        "TF_OTEL_OPS_SIGNAL_STEPS",
        parse.non_negative_int,
        10,
        "steps with op-level detail after a SIGUSR2",
    )
    horovod: bool = setting(
        "TF_OTEL_HOROVOD",
        parse.flag,
        True,
        "Horovod collective spans on collective-detail steps (docs/guides/HOROVOD.md)",
    )
    # the neutral name wins: it names tf.distribute's collectives too
    horovod_every: int = setting(
        "TF_OTEL_HOROVOD_EVERY",
        parse.non_negative_int,
        HOROVOD_EVERY_DEFAULT,
        "collective detail on 1 sampled step in N, the same steps on every rank (1: every "
        "sampled step; 0: none). Detail steps run a twin of the step's tf.function holding the "
        "timing ops; other steps run the program's own graph (docs/guides/HOROVOD.md, why 20); "
        "tf.distribute's collectives (MultiWorkerMirroredStrategy, MirroredStrategy) follow it "
        "too. `TF_OTEL_COLLECTIVE_EVERY` is the same under a name for any job's collectives; "
        "where both are set, it wins",
        also=("TF_OTEL_COLLECTIVE_EVERY",),
    )
    horovod_source: str = setting(
        "TF_OTEL_HOROVOD_SOURCE",
        parse.one_of("stamps", "timeline"),
        "stamps",
        "`stamps`: every rank times its own collectives; `timeline`: rank 0's Horovod timeline "
        "(a spinning thread from hvd.init)",
    )
    twin_prepare: str = setting(
        "TF_OTEL_TWIN_PREPARE",
        parse.one_of("background", "step"),
        "background",
        "`background`: the detail twin is traced and instantiated on a thread of its own, "
        "picked steps before it is ready on every rank run the program's function "
        "(`tf_otel.detail.twin = preparing`); `step`: on the step that traced the program's "
        "function (seconds on that step; every picked step detailed)",
    )
    twin_cpu_floor: float = setting(
        "TF_OTEL_TWIN_CPU_FLOOR",
        parse.core_share,
        1 / 64,
        "background preparation: the share of one core the twin's trace takes where the "
        "training leaves no core idle (it takes up to half a core of idle ones); on saturated "
        "cores every step pays about this share while a preparation is under way (1/64: ~1 %, "
        "1/32: ~3 % on MirroredStrategy), and the preparation takes longer the lower it is",
        shown="0.015625 (1/64)",
    )
    horovod_parts: Optional[bool] = setting(
        "TF_OTEL_HOROVOD_PARTS",
        parse.flag,
        None,
        "stamps source (the default; the timeline source always has them): `wait` and "
        "`transfer` children under a collective whose rank waited ≥ 1 ms; 0: one span per "
        "collective, the wait in `horovod.wait_ns` (read by the analysis too): about half the "
        "spans of a detail step (every-step detail on MobileNetV2: 0.895× with children, "
        "0.930× without)",
        shown="1 where `TF_OTEL_HOROVOD_EVERY` ≥ 10, else 0",
    )
    horovod_fused: Optional[bool] = setting(
        "TF_OTEL_HOROVOD_FUSED",
        parse.flag,
        None,
        "stamps source: one `collective` span per group of tensors that completed together "
        "(Horovod's fused responses, as rank 0's own end times tell them; "
        "`horovod.fused_tensors`, bytes summed, the same groups on every rank); 0: one span per "
        "tensor. Dense detail's cost is its span volume (docs/guides/HOROVOD.md)",
        shown="1 where `TF_OTEL_HOROVOD_EVERY` < 10, else 0",
    )
    horovod_exact: bool = setting(
        "TF_OTEL_HOROVOD_EXACT",
        parse.flag,
        False,
        "with `timeline`: exact per-rank arrival on every step (turns off Horovod's response "
        "cache: `HOROVOD_CACHE_CAPACITY=0`)",
    )
    clock_interval_s: float = setting(
        "TF_OTEL_CLOCK_INTERVAL_S",
        parse.positive_float,
        60.0,
        "clock resync period against rank 0 (after a fast warm-up)",
    )
    gpu_metrics_interval_s: float = setting(
        "TF_OTEL_GPU_METRICS_INTERVAL_S",
        parse.non_negative_float,
        10.0,
        "GPU metrics (`hw.gpu.*`) sampling via NVML, summarised on each step span (0: off; "
        "silent without a GPU)",
    )
    input_wait: Optional[bool] = setting(
        "TF_OTEL_INPUT_WAIT",
        parse.flag,
        None,
        "every step's wait on tf.data (docs/guides/WHOLE_STEP.md): unset, for Keras fit / "
        "evaluate / predict and datasets iterated inside a tf.function; 1: also every other "
        "iterator (`next(it)` in a custom loop's tf.function; such an iterator can then not be "
        "checkpointed); 0: off",
        shown="unset: on",
    )
    resources_every: int = setting(
        "TF_OTEL_RESOURCES_EVERY",
        parse.non_negative_int,
        0,
        "peak RSS (sampled every 1 ms), per-file I/O (file positions) and, on a GPU, the "
        "allocator's peak on steps 0, N, 2N ... of every step key (docs/guides/WHOLE_STEP.md); "
        "0: off",
    )
    system_metrics_interval_s: float = setting(
        "TF_OTEL_SYSTEM_METRICS_INTERVAL_S",
        parse.non_negative_float,
        10.0,
        "host and process metrics, OTel semconv names, when a MeterProvider is set (0: off)",
    )
    nccl_ring_dir: str = setting(
        "TF_OTEL_NCCL_RING_DIR",
        parse.directory,
        "/dev/shm",
        "where the NCCL profiler plugin's ring files live",
    )
    nccl_profiler: bool = setting(
        "TF_OTEL_NCCL_PROFILER",
        parse.flag,
        False,
        "1: set `NCCL_PROFILER_PLUGIN` to tf_otel's plugin (`tf-otel nccl-plugin` builds it; "
        "`make nccl-plugin` in a clone); each sampled step then gets its NCCL collectives as "
        "`nccl.<Coll>` spans (docs/guides/NCCL.md)",
    )
    analyze_workers: int = setting(
        "TF_OTEL_ANALYZE_WORKERS",
        parse.non_negative_int,
        0,
        "Dask worker processes `tf-otel analyze` runs on (1: this process only; set, it "
        "applies to small inputs too)",
        shown="one per CPU for inputs ≥ 256 MB",
    )
    test_clock: Optional[str] = setting(
        "TF_OTEL_TEST_CLOCK",
        parse.text,
        None,
        "**tests only**: `<rank>:<skew_ns>:<drift_ppm>` (several joined by `,`) shifts the "
        "clock tf_otel reads on that rank",
    )

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> Settings:
        """The settings ``env`` (default: this process's environment) gives; a bad value is
        named in one log line and its default used, an unknown TF_OTEL_* name is named too."""
        env = os.environ if env is None else env
        warn_unknown(env)
        values: Dict[str, Any] = {}
        for spec in SPECS:
            found = resolve(spec, env)
            for variable, raw, why, default in found.rejected:
                log_once(
                    "config:" + variable,
                    "tf_otel: ignoring %s=%r (%s); using the default %r",
                    variable,
                    raw,
                    why,
                    default,
                )
            values[spec.name] = found.value
        return cls(**values)


@dataclass(frozen=True)
class Spec:
    """One setting as ``Settings`` declares it."""

    name: str  # the field
    variables: Tuple[str, ...]  # read in this order: a later one that is set wins
    parse: Callable[[str], Any]
    default: Any
    doc: str
    shown: str  # the default as the docs say it
    secret: bool


def _show(default: Any) -> str:
    """A default as the docs say it."""
    if default is None:
        return "unset"
    if isinstance(default, bool):
        return "1" if default else "0"
    if isinstance(default, float):
        return f"{default:g}"
    return str(default)


def _spec(declared: Field[Any]) -> Spec:
    given = dict(declared.metadata[_SPEC])
    given["shown"] = given["shown"] or _show(declared.default)
    return Spec(name=declared.name, default=declared.default, **given)


SPECS: Tuple[Spec, ...] = tuple(_spec(f) for f in fields(Settings))
# Every TF_OTEL_* variable tf_otel reads.
VARIABLES: Tuple[str, ...] = tuple(name for spec in SPECS for name in spec.variables)
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


@dataclass(frozen=True)
class Resolved:
    """A setting's value in one environment and where it came from."""

    value: Any
    variable: Optional[str]  # the variable that gave it; None: the default
    rejected: Tuple[Tuple[str, str, str, Any], ...]  # (variable, raw value, why, value kept)


def resolve(spec: Spec, env: Mapping[str, str]) -> Resolved:
    """``spec``'s value in ``env``: a bad value is passed over (and kept in ``rejected``)."""
    value, variable = spec.default, None
    rejected: List[Tuple[str, str, str, Any]] = []
    for name in spec.variables:
        raw = env.get(name)
        if raw is None:
            continue
        try:
            value, variable = spec.parse(raw), name
        except (ValueError, TypeError) as exc:
            rejected.append((name, raw, str(exc), value))
    return Resolved(value, variable, tuple(rejected))


def unknown(env: Mapping[str, str]) -> List[Tuple[str, Optional[str]]]:
    """TF_OTEL_* names in ``env`` tf_otel does not know, each with the closest known one."""
    found = []
    for name in env:
        if name.startswith("TF_OTEL_") and name not in VARIABLES + SCRIPT_VARIABLES:
            close = difflib.get_close_matches(name, VARIABLES, n=1)
            found.append((name, close[0] if close else None))
    return found


def warn_unknown(env: Mapping[str, str]) -> None:
    """A TF_OTEL_* name tf_otel does not know is a typo that would be silently ignored: say so."""
    for name, close in unknown(env):
        log_once(
            "config_unknown:" + name,
            "tf_otel: unknown setting %s=%r is ignored%s",
            name,
            env[name],
            f"; did you mean {close}?" if close else "",
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
