"""Start-up hook for ``TF_OTEL_ENABLED=1`` (imported by tf_otel-autostart.pth in site-packages).

Configures the SDK from OTEL_* (unless the process already has one) and instruments TensorFlow,
in every Python process started with the variable: every rank under horovodrun / mpirun / srun.
Launcher processes (horovodrun itself) are left alone.
"""

from __future__ import annotations

import os
import sys

_LAUNCHERS = ("horovodrun", "mpirun", "mpiexec", "srun", "torchrun")


def _is_launcher() -> bool:
    argv0 = os.path.basename(sys.argv[0]) if getattr(sys, "argv", None) else ""
    return argv0 in _LAUNCHERS or "horovod.runner" in " ".join(getattr(sys, "orig_argv", [])[:3])


def main() -> None:
    if (
        _is_launcher()
        or os.environ.get("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "").find("tensorflow") >= 0
    ):
        return
    try:
        import tf_otel

        tf_otel.instrument(configure_sdk=True)
    except Exception as exc:  # noqa: BLE001 - never stop the interpreter from starting
        sys.stderr.write(f"tf_otel: TF_OTEL_ENABLED=1 but start-up failed ({exc}); not tracing\n")


main()
