"""Settings read once from the environment (TF_OTEL_*; OTEL_* are left to the SDK).

A bad value never stops the job: it is reported in one log line naming the variable and the value,
and the default is used instead.

Variables: TF_OTEL_ENABLED, TF_OTEL_JOB_ID, TF_OTEL_FILE, TF_OTEL_ROOT_WAIT_MS,
TF_OTEL_MAX_QUEUE, TF_OTEL_OPS_EVERY, TF_OTEL_COORDINATOR, TF_OTEL_STEP_FUNCTIONS,
TF_OTEL_TEST_CLOCK (test only; "<rank>:<skew_ns>:<drift_ppm>", several joined by ","; read by
tf_otel.clock directly), TF_OTEL_CLOCK_INTERVAL_S, TF_OTEL_GPU_METRICS_INTERVAL_S,
TF_OTEL_JOB_SECRET (the same random value on every rank: authenticates the cross-rank channel;
see tf_otel.job_secret for what is used without it),
TF_OTEL_HOROVOD_EVERY (collective detail on 1 sampled step in N, picked by the step trace id so
every rank picks the same steps; 1: every sampled step, 0: none; default 10, docs/HOROVOD.md),
TF_OTEL_HOROVOD_SOURCE (``stamps``, the default: every rank times its own collectives;
``timeline``: Horovod's DYNAMIC timeline on rank 0, which costs a spinning thread from hvd.init).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Tuple, TypeVar

from tf_otel.health import log_once

T = TypeVar("T")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


class ConfigError(ValueError):
    """A setting that cannot be used; the message names the variable and the value."""


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError("expected one of 1/true/yes/on or 0/false/no/off")


def _non_negative_int(text: str) -> int:
    value = int(text.strip())
    if value < 0:
        raise ValueError("expected an integer >= 0")
    return value


def _positive_float(text: str) -> float:
    value = float(text.strip())
    if not value > 0:
        raise ValueError("expected a number > 0")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text.strip())
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
    file: Optional[str] = None
    root_wait_ms: float = 3000.0
    max_queue: int = 4096
    ops_every: int = 0
    coordinator: Optional[Tuple[str, int]] = None
    step_functions: Tuple[str, ...] = ()
    test_clock: Optional[str] = None
    clock_interval_s: float = 60.0
    gpu_metrics_interval_s: float = 10.0  # 0: off
    horovod_every: int = 10  # collective detail on 1 sampled step in N (docs/HOROVOD.md)
    horovod_source: str = "stamps"  # or "timeline"
    # authenticates rank <-> rank 0 (tf_otel.job_secret); never in a repr or a log line
    job_secret: Optional[str] = field(default=None, repr=False)

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> Settings:
        env = os.environ if env is None else env
        return cls(
            enabled=read(env, "TF_OTEL_ENABLED", _bool, False),
            job_id=(env.get("TF_OTEL_JOB_ID") or "").strip() or None,
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
            job_secret=(env.get("TF_OTEL_JOB_SECRET") or "").strip() or None,
            horovod_every=read(env, "TF_OTEL_HOROVOD_EVERY", _non_negative_int, 10),
            horovod_source=read(env, "TF_OTEL_HOROVOD_SOURCE", _horovod_source, "stamps"),
        )
