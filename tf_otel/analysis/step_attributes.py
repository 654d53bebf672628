"""The names of the whole-step attributes the analysis reads on step spans.

Usage::

    from tf_otel.analysis.step_attributes import ATTR_INPUT_WAIT, WHOLE_STEP_ATTRIBUTES

The runtime writes them (tf_otel/instrument/step_resources.py, input_wait.py, keras.py); they
are repeated here because the analysis never imports the runtime (tests/analysis/
test_step_rules.py checks the two agree). A module of its own: ``model`` keeps these attributes
at load and ``whole_step`` reads them off ``model.Span``.
"""

from __future__ import annotations

ATTR_INPUT_WAIT = "tf_otel.input.wait_ns"
ATTR_INPUT_ELEMENTS = "tf_otel.input.elements"
ATTR_BETWEEN = "tf_otel.between_steps_ns"
ATTR_CALLBACK = "tf_otel.between_steps.callback_ns"
ATTR_CHECKPOINT = "tf_otel.between_steps.checkpoint_ns"
ATTR_TOP = "tf_otel.between_steps.top"
ATTR_READ_BYTES = "tf_otel.io.read_bytes"
ATTR_READ_OPS = "tf_otel.io.read_ops"
ATTR_CPU_TIME = "tf_otel.process.cpu_time_ns"
ATTR_CPUS = "tf_otel.process.cpus"
ATTR_MEMORY = "process.memory.usage"
ATTR_HW_GPU_UTILIZATION = "hw.gpu.utilization"  # semconv name (ratio 0..1)
ATTR_BATCH_SIZE = "tf_otel.batch.size"

WHOLE_STEP_ATTRIBUTES = frozenset(
    (
        ATTR_INPUT_WAIT,
        ATTR_INPUT_ELEMENTS,
        ATTR_BETWEEN,
        ATTR_CALLBACK,
        ATTR_CHECKPOINT,
        ATTR_TOP,
        ATTR_READ_BYTES,
        ATTR_READ_OPS,
        ATTR_CPU_TIME,
        ATTR_CPUS,
        ATTR_MEMORY,
        ATTR_HW_GPU_UTILIZATION,
        ATTR_BATCH_SIZE,
    )
)
