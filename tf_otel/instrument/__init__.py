"""``TensorFlowInstrumentor``: the OpenTelemetry instrumentor (entry point ``tensorflow``).

Usage::

    opentelemetry-instrument python train.py
    OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=tensorflow opentelemetry-instrument python train.py  # off

    from tf_otel.instrument import TensorFlowInstrumentor
    TensorFlowInstrumentor().instrument()
    TensorFlowInstrumentor().uninstrument()

Patches are registered as post-import hooks: TensorFlow is never imported by tf_otel itself.
"""

from __future__ import annotations

import sys
import types
from typing import Any, Collection

# instrumentor.py is "# type: ignore" as a whole, so mypy sees none of its names
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]

from tf_otel.instrument import (
    _patching,
    attempt,
    cluster,
    data,
    function,
    horovod,
    input_wait,
    keras,
    nccl_ring,
    ps,
    session,
    step_context,
    step_detail,
    step_resources,
    tf_collectives,
    twin_threads,
)
from tf_otel.instrument.ops import hook as ops

MIN_TF_VERSION = (2, 15)


def check_tensorflow_version(module: Any) -> bool:
    """Log once when TF is older than tested; tracing still tries (each patch fails open)."""
    from tf_otel.health import log_once

    version = str(getattr(module, "__version__", "0"))
    try:
        major_minor = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        major_minor = (0, 0)
    if major_minor < MIN_TF_VERSION:
        log_once(
            "tf_version",
            "tf_otel: TensorFlow %s is older than the supported %d.%d; steps that cannot be "
            "patched are not traced, training is unaffected",
            version,
            *MIN_TF_VERSION,
        )
        return False
    return True


class TensorFlowInstrumentor(BaseInstrumentor):
    """Traces training steps of TF1 sessions, Keras / tf_keras fit and top-level tf.functions."""

    def instrumentation_dependencies(self) -> Collection[str]:
        # None named, on purpose: BaseInstrumentor.instrument() refuses (one error line, nothing
        # patched) unless every requirement named here is installed under that exact
        # distribution name, with no "any of" form, and the module comes as tensorflow,
        # tensorflow-cpu, tf-nightly, tensorflow-macos... What counts is the module: patches
        # wait for `import tensorflow`, and check_tensorflow_version says once if it is too old.
        return ()

    def _instrument(self, **kwargs: Any) -> None:
        """kwargs: ``configure_sdk`` (set up the SDK from OTEL_* when no provider is set), and
        ``tracer_provider`` / ``meter_provider`` as the contrib instrumentations take them."""
        from tf_otel import config
        from tf_otel.health import fail_open
        from tf_otel.otel import sdk
        from tf_otel.runtime import lifecycle, signals

        # read once here, handed to every register(): later changes of the environment reach
        # none of them
        settings = config.use(config.Settings.from_env())
        tracer_provider = kwargs.get("tracer_provider")
        lifecycle.use_tracer_provider(tracer_provider)
        sdk.use_meter_provider(kwargs.get("meter_provider"))
        with fail_open("sdk.configure"):
            if kwargs.get("configure_sdk", True) and tracer_provider is None:
                sdk.configure_from_env(settings)
            sdk.quiet_exporter_logs()
            if settings.file:
                sdk.add_file_exporter(
                    sdk.file_path_for_rank(settings.file),
                    max_bytes=int(settings.file_max_mb * 1024 * 1024),
                    keep=settings.file_keep,
                    provider=tracer_provider,
                    template=settings.file if sdk.rank_known_later(settings.file) else None,
                    flush_s=settings.file_flush_s,
                )
        with fail_open("delivery.watch"):  # after every span processor is in place
            from opentelemetry import trace

            from tf_otel.otel import delivery

            delivery.watch(tracer_provider or trace.get_tracer_provider())
        signals.install_exit_handlers(settings.exit_timeout_s)
        _patching.activate()
        _patching.when_imported("tensorflow", check_tensorflow_version)
        for module in (
            cluster,
            attempt,
            session,
            keras,
            function,
            ops,
            data,
            input_wait,
            step_resources,
            step_detail,
            ps,
            horovod,
            tf_collectives,
            twin_threads,
            nccl_ring,
        ):
            module.register(settings)
        step_context.register(settings)

    def _uninstrument(self, **kwargs: Any) -> None:
        _patching.deactivate()
        step_context.release()


class _CallablePackage(types.ModuleType):
    """``tf_otel.instrument`` names both this package and the function ``tf_otel.instrument()``:
    importing the package (which the function itself does) rebinds that name on ``tf_otel`` to
    the package, so calling the package does what the function does."""

    def __call__(self, configure_sdk: bool = True, **kwargs: Any) -> None:
        TensorFlowInstrumentor().instrument(configure_sdk=configure_sdk, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
