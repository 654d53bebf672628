"""Which step-span attributes the analysis keeps at load: the whole-step ones (names: record).

Usage::

    from tf_otel.analysis.step_attributes import WHOLE_STEP_ATTRIBUTES

The runtime writes them (tf_otel/instrument/step_resources.py, input_wait.py, keras.py); both
sides take the names from ``tf_otel.record``, the one home of the trace contract's names
(tests/test_architecture.py keeps it so). A module of its own: ``model`` keeps these attributes
at load and ``whole_step`` reads them off ``model.Span``.
"""

from __future__ import annotations

from tf_otel import record

WHOLE_STEP_ATTRIBUTES = frozenset(
    (
        record.ATTR_INPUT_WAIT,
        record.ATTR_INPUT_ELEMENTS,
        record.ATTR_INPUT_SEEN,
        record.ATTR_STEP_REPLICAS,
        record.ATTR_BETWEEN,
        record.ATTR_CALLBACK,
        record.ATTR_CHECKPOINT,
        record.ATTR_TOP,
        record.ATTR_READ_BYTES,
        record.ATTR_READ_OPS,
        record.ATTR_CPU_TIME,
        record.ATTR_CPUS,
        record.ATTR_MEMORY,
        record.ATTR_HW_GPU_UTILIZATION,
        record.ATTR_BATCH_SIZE,
        record.ATTR_DETAIL,
    )
)
