"""tf_otel: OpenTelemetry tracing for distributed TensorFlow training.

Usage::

    opentelemetry-instrument python train.py           # entry point "tensorflow"
    TF_OTEL_ENABLED=1 horovodrun -np 4 python train.py  # every rank, no wrapper

    import tf_otel; tf_otel.instrument()               # or in code, before or after TF

Importing tf_otel never imports TensorFlow: patches apply when TF is imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tf_otel import stderr_once
from tf_otel.version import __version__

__all__ = ["instrument", "shutdown", "TensorFlowInstrumentor", "__version__"]

if TYPE_CHECKING:
    from tf_otel.instrument import TensorFlowInstrumentor

# operator lines (lost spans, unwritable file, bad settings) reach stderr once, whatever logging
# handlers the OpenTelemetry distro or the program installs
stderr_once.install()


def instrument(configure_sdk: bool = True, **kwargs: Any) -> None:
    """Instrument TensorFlow (and Horovod) in this process; idempotent.

    configure_sdk: set up the OpenTelemetry SDK from OTEL_* when no TracerProvider is set yet.
    """
    from tf_otel.instrument import TensorFlowInstrumentor

    TensorFlowInstrumentor().instrument(configure_sdk=configure_sdk, **kwargs)


def shutdown(timeout_s: float = 5.0) -> None:
    """Flush pending spans, bounded by timeout_s (also done at exit and on SIGTERM)."""
    from tf_otel.runtime.lifecycle import shutdown as _shutdown

    _shutdown(timeout_s)


def __getattr__(name: str) -> Any:
    if name == "TensorFlowInstrumentor":
        from tf_otel.instrument import TensorFlowInstrumentor

        return TensorFlowInstrumentor
    raise AttributeError(name)
