"""Op-level tracing on chosen steps: TF1 FULL_TRACE step_stats, TF2 profiler XSpace.

Which steps (the same on every rank; only sampled steps are traced):

- ``TF_OTEL_OPS_EVERY=N``: steps 0, N, 2N ... of every step key;
- on demand (``ops.admin``: HTTP endpoint or SIGUSR2): the next K steps, from a start step
  rank 0 chooses (its current step + a margin) and broadcasts.

Per traced step, on the training thread: TF1 ``Session.run`` gets ``RunOptions(trace_level=
FULL_TRACE)`` merged into a COPY of the caller's options and our own ``RunMetadata`` (the caller's
metadata is still filled); TF2 steps (Keras train / test / predict functions, tf.function steps)
run inside a TF profiler session (to a temp dir, removed after parsing). Conversion to Records
(``sources.step_stats`` / ``sources.xplane`` / ``sources.xplane_gpu``) runs on the export thread.
``TF_OTEL_MAX_OP_SPANS`` (default 500) caps op spans per step: the longest are kept, the rest
summarised on an ``op trace summary`` span.

If the program runs its own TF profiler session, TF2 op tracing backs off (one log line).
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from tf_otel.cluster import messages
from tf_otel.config import Settings
from tf_otel.health import count, fail_open, log_once
from tf_otel.instrument._patching import Error, HookOrder, StepCall, StepHook, add_step_hook
from tf_otel.record import INPUT, SESSION_RUN, Record
from tf_otel.runtime.gather import to_every_rank, to_reference
from tf_otel.runtime.steps import Pipeline
from tf_otel.step_handle import StepHandle

# set by register() from the settings instrument() read (the defaults until then)
MAX_OP_SPANS = Settings.max_op_spans
# steps between rank 0's decision and the first on-demand traced step (at least this many, and
# at least ~TF_OTEL_OPS_MARGIN_S worth of steps so the broadcast arrives in time)
MARGIN_STEPS = Settings.ops_margin
MARGIN_S = Settings.ops_margin_s
MAX_ON_DEMAND = 10_000
_PROFILER_OPTIONS = {"host_tracer_level": 2, "python_tracer_level": 0, "device_tracer_level": 1}


class OpsController:
    """Decides which (key, step) get op tracing; thread-safe where it must be."""

    def __init__(self, every: int = 0) -> None:
        self.every = every
        self.windows: Dict[str, Tuple[int, int]] = {}  # key -> [start, stop)
        self.last: Dict[str, Tuple[int, float, float]] = {}  # key -> (step, t, ema step s)
        self._lock = threading.Lock()

    def seen(self, key: str, step: int) -> None:
        now = time.monotonic()
        previous = self.last.get(key)
        ema = 0.0
        if previous is not None and step > previous[0]:
            dt = (now - previous[1]) / (step - previous[0])
            ema = dt if not previous[2] else 0.8 * previous[2] + 0.2 * dt
        self.last[key] = (step, now, ema)

    def wanted(self, key: str, step: int) -> bool:
        if self.every and step % self.every == 0:
            return True
        window = self.windows.get(key)
        return window is not None and window[0] <= step < window[1]

    def decide(self, steps: int) -> Dict[str, int]:
        """Rank 0: the start step of each known key for ``steps`` traced steps."""
        starts = {}
        for key, (step, _, ema) in list(self.last.items()):
            by_time = int(MARGIN_S / ema) + 1 if ema > 0 else 0
            starts[key] = step + 1 + max(MARGIN_STEPS, min(by_time, 1000))
        return starts

    def apply(self, starts: Dict[str, int], steps: int) -> None:
        steps = max(1, min(int(steps), MAX_ON_DEMAND))
        late = []
        with self._lock:
            for key, start in starts.items():
                self.windows[key] = (int(start), int(start) + steps)
                current = self.last.get(key)
                if current is not None and current[0] >= int(start):
                    late.append(key)
        if late:
            log_once(
                "ops_late",
                "tf_otel: on-demand op tracing reached this rank after its start step for %s; "
                "only the remaining steps are traced here",
                late[:3],
            )


controller = OpsController()


def request(steps: int) -> Dict[str, int]:
    """Ask for op tracing of the next ``steps`` steps on every rank (any thread, any rank).
    On rank 0 (or a single process) returns the chosen start step per key."""
    from tf_otel.runtime.lifecycle import get_pipeline

    pipeline = get_pipeline()
    if not pipeline.topology.is_reference:
        to_reference(pipeline, messages.ops_request(steps), _on_request)
        return {}
    starts = controller.decide(steps)
    to_every_rank(pipeline, messages.ops_window(starts, steps), _on_window)
    log_once(
        "ops_request", "tf_otel: op tracing of %d steps from %s on every rank", steps, starts,
        level=20,
    )  # fmt: skip
    return starts


def status() -> Dict[str, Any]:
    """The admin endpoint's GET /status: the sampling period and the on-demand windows."""
    windows = {k: list(v) for k, v in controller.windows.items()}
    return {"every": controller.every, "windows": windows}


def _handle_messages(pipeline: Pipeline) -> None:
    pipeline.handlers.on_rank(messages.OPS_WINDOW, _on_window)
    pipeline.handlers.on_reference(messages.OPS_REQUEST, _on_request)


def _on_window(message: Dict[str, Any]) -> None:
    controller.apply(dict(message.get("w") or {}), int(message.get("n") or 1))


def _on_request(rank: int, message: Dict[str, Any]) -> None:
    request(int(message.get("n") or 1))


# -- TF1 ------------------------------------------------------------------------------------


def _session_args(call: StepCall) -> Tuple[Any, Any]:
    """Normalise Session.run(fetches, feed_dict, options, run_metadata) to kwargs."""
    args = list(call.args)
    for index, name in ((3, "run_metadata"), (2, "options")):
        if len(args) > index:
            call.kwargs[name] = args.pop(index)
    call.args = tuple(args)
    return call.kwargs.get("options"), call.kwargs.get("run_metadata")


# what an op-traced step keeps from its start to its end: ("tf1", ours, theirs, user_traced)
# (RunMetadata objects) or ("tf2", profiler session, logdir, base_ns)
Capture = Tuple[str, Any, Any, Any]


def _tf1_start(call: StepCall) -> Capture:
    from tensorflow.core.protobuf import config_pb2

    options, theirs = _session_args(call)
    merged = config_pb2.RunOptions()
    if options is not None:
        merged.CopyFrom(options)
    user_traced = merged.trace_level != config_pb2.RunOptions.NO_TRACE
    merged.trace_level = config_pb2.RunOptions.FULL_TRACE
    ours = config_pb2.RunMetadata()
    call.kwargs["options"] = merged
    call.kwargs["run_metadata"] = ours
    return ("tf1", ours, theirs, user_traced)


def _tf1_end(handle: StepHandle, capture: Capture) -> None:
    _, ours, theirs, user_traced = capture
    if theirs is not None:
        for field, value in ours.ListFields():
            if field.name == "step_stats" and not user_traced:
                continue  # they did not ask for it
            if field.label == field.LABEL_REPEATED:
                getattr(theirs, field.name).extend(value)
            else:
                getattr(theirs, field.name).MergeFrom(value)
    step, limit = handle.step, MAX_OP_SPANS

    def convert() -> List[Record]:
        from tf_otel.sources.step_stats import step_stats_capped

        return step_stats_capped(ours.step_stats, step, limit, "step_stats")

    handle.deferred.append(convert)


# -- TF2 ------------------------------------------------------------------------------------

_profiler_module: List[Any] = []


def _user_profiler_active() -> bool:
    if not _profiler_module:
        from tensorflow.python.profiler import profiler_v2

        _profiler_module.append(profiler_v2)
    return _profiler_module[0]._profiler is not None


def _tf2_start() -> Optional[Capture]:
    if _user_profiler_active():
        count("ops_backoff")
        log_once(
            "ops_backoff",
            "tf_otel: a TF profiler session of the program is running; TF2 op tracing is "
            "skipped while it runs (step spans continue)",
        )
        return None
    from tensorflow.python.profiler.internal import _pywrap_profiler

    logdir = tempfile.mkdtemp(prefix="tf_otel_ops_")
    session = _pywrap_profiler.ProfilerSession()
    base_ns = time.time_ns()
    try:
        session.start(logdir, dict(_PROFILER_OPTIONS))
    except Exception as exc:  # noqa: BLE001 - AlreadyExistsError: someone else's session
        shutil.rmtree(logdir, ignore_errors=True)
        count("ops_backoff")
        log_once(
            "ops_backoff",
            "tf_otel: cannot start a TF profiler session (%s); another profiler (the program's "
            "or a profiler server) is probably active. TF2 op tracing skipped while it runs",
            exc,
        )
        return None
    return ("tf2", session, logdir, base_ns)


def _tf2_end(handle: StepHandle, capture: Capture) -> None:
    _, session, logdir, base_ns = capture
    try:
        session.export_to_tb()  # stops the session; writes <logdir>/plugins/profile/*/*.xplane.pb
    except Exception:
        shutil.rmtree(logdir, ignore_errors=True)
        raise
    step, limit = handle.step, MAX_OP_SPANS

    def convert() -> List[Record]:
        try:
            return xspace_records(logdir, step, limit, base_ns)
        finally:
            shutil.rmtree(logdir, ignore_errors=True)

    handle.deferred.append(convert)


def xspace_records(logdir: str, step: Optional[int], limit: int, base_ns: int) -> List[Record]:
    """Host op / input / function Records, GPU kernels grouped under their TF ops, capped."""
    from tf_otel.sources.gpu_ops import cap_op_tree, group_kernels_by_op
    from tf_otel.sources.tf_data import stage_records
    from tf_otel.sources.xplane import host_records, parse_xspace

    records: List[Record] = []
    kernels: List[Record] = []
    spaces = []
    for path in glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb")):
        with open(path, "rb") as f:
            space = parse_xspace(f.read())
        spaces.append(space)
        records.extend(host_records(space, step, base_ns))
        if any(p.name.startswith("/device:GPU:") for p in space.planes):
            with fail_open("ops.gpu_kernels"):
                from tf_otel.sources.xplane_gpu import gpu_kernel_records

                kernels.extend(gpu_kernel_records(space, step=step, base_ns=base_ns))
    if kernels:
        with fail_open("ops.gpu_ops"):
            kernels = group_kernels_by_op(kernels, step)
    out = cap_op_tree(records + kernels, limit, step) if records or kernels else []
    # tf.data stages under the step's first kept IteratorGetNext (else the step span)
    parent = next((r.record_id for r in out if r.category == INPUT), None)
    for space in spaces:
        with fail_open("ops.tf_data_stages"):
            out.extend(stage_records(space, step, base_ns, parent))
    return out


# -- the hook -------------------------------------------------------------------------------


class OpsHook(StepHook[Capture]):
    order = HookOrder.OPS
    endpoint_started = False
    # TF_OTEL_ADMIN_PORT / TF_OTEL_ADMIN_TOKEN, given by register(); no port: no endpoint
    admin_port: Optional[int] = None
    admin_token: Optional[str] = None

    def on_step_start(self, handle: StepHandle, call: StepCall) -> Optional[Capture]:
        if not self.endpoint_started:
            self.endpoint_started = True
            if self.admin_port is not None:
                from tf_otel.instrument.ops import admin

                threading.Thread(
                    target=admin.start_on_rank0,
                    args=(self.admin_port, self.admin_token),
                    name="tf_otel-admin-start",
                    daemon=True,
                ).start()
        controller.seen(handle.key, handle.step)
        if not handle.sampled or not controller.wanted(handle.key, handle.step):
            return None
        if handle.key.startswith("ps_closure:"):
            return None  # TF2 PS closures: the ops run in the remote worker processes
        if call.kind == SESSION_RUN:
            if handle.name != "Session.run":  # make_callable's options are fixed at creation
                return None
            capture: Optional[Capture] = _tf1_start(call)
        else:
            capture = _tf2_start()
        if capture is not None:
            handle.mark_detail("ops")
        return capture

    def on_step_end(
        self, handle: StepHandle, call: StepCall, error: Error, kept: Optional[Capture]
    ) -> None:
        if kept is None:
            return
        if kept[0] == "tf1":
            _tf1_end(handle, kept)
        else:
            _tf2_end(handle, kept)


hook = OpsHook()


def register(settings: Settings) -> None:
    global MAX_OP_SPANS, MARGIN_STEPS, MARGIN_S
    from tf_otel.runtime.lifecycle import with_pipeline

    MAX_OP_SPANS = settings.max_op_spans
    MARGIN_STEPS, MARGIN_S = settings.ops_margin, settings.ops_margin_s
    controller.every = settings.ops_every
    hook.admin_port, hook.admin_token = settings.admin_port, settings.admin_token
    with_pipeline(_handle_messages)
    add_step_hook(hook)
    with fail_open("admin.start"):
        from tf_otel.instrument.ops import admin

        admin.connect(request, status)
        admin.install(settings.ops_signal_steps)
