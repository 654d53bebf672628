"""The names of the whole-step attributes the analysis reads on step spans.

Usage::

    from tf_otel.analysis.step_attributes import ATTR_INPUT_WAIT, WHOLE_STEP_ATTRIBUTES

The runtime writes them (tf_otel/instrument/step_resources.py, input_wait.py, keras.py); both
sides take the names from ``tf_otel.record``, the one home of the trace contract's names
(tests/test_architecture.py keeps it so). A module of its own: ``model`` keeps these attributes
at load and ``whole_step`` reads them off ``model.Span``.
"""

from __future__ import annotations

from tf_otel.record import (
    ATTR_BATCH_SIZE,
    ATTR_BETWEEN,
    ATTR_CALLBACK,
    ATTR_CHECKPOINT,
    ATTR_CPU_TIME,
    ATTR_CPUS,
    ATTR_HW_GPU_UTILIZATION,
    ATTR_INPUT_ELEMENTS,
    ATTR_INPUT_WAIT,
    ATTR_MEMORY,
    ATTR_READ_BYTES,
    ATTR_READ_OPS,
    ATTR_TOP,
)

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
