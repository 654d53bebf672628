"""Cost of making each step the current OpenTelemetry context (tf_otel/instrument/step_context.py)
on the training thread, in-process, no TensorFlow: the step wrapper (``_patching.run_step``) on an
empty step body with the step-context hook and without it, in alternating blocks (same process,
same load). Also the first read of a step's span context (the id hash, paid only by steps in
which something makes a span or a log record) and an attach (a step that begins while a user's
span is current).

    .venv/bin/python bench/bench_step_context.py [--rounds 10] [--block 20000]

Prints the medians over rounds in microseconds per step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OTEL_TRACES_EXPORTER", "none")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--block", type=int, default=20000)
    args = parser.parse_args()

    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    from tf_otel import record
    from tf_otel.config import Settings
    from tf_otel.instrument import _patching
    from tf_otel.instrument.step_context import StepContextHook
    from tf_otel.job.topology import Topology
    from tf_otel.runtime.steps import Pipeline

    provider = TracerProvider()
    pipeline = Pipeline(Settings(), Topology(job_id="bench"), provider)
    pipeline._start()
    pipeline._closed = True  # time the training-thread side only: nothing queued for export
    hook = StepContextHook(lambda: pipeline)
    _patching._get_pipeline = lambda: pipeline  # type: ignore[assignment]
    _patching.activate()
    key, name, kind = "tf_function:f", "tf.function f", record.TF_FUNCTION

    def body() -> None:
        pass

    def block(hooks: list) -> float:
        _patching.step_hooks = tuple(hooks)
        start = time.perf_counter_ns()
        for _ in range(args.block):
            _patching.run_step(body, (), {}, key, name, kind)
        return (time.perf_counter_ns() - start) / args.block / 1000.0

    off, on, reads, attaches = [], [], [], []
    tracer = provider.get_tracer("bench")
    for _ in range(args.rounds):
        off.append(block([]))
        on.append(block([hook]))
        # first read of the span context in a step (what a user span / log record pays once)
        handle = pipeline.begin_step(key, name, kind)
        t0 = time.perf_counter_ns()
        for _ in range(1000):
            hook.local.steps.handle = handle = pipeline.begin_step(key, name, kind)
            trace.get_current_span().get_span_context()
        reads.append((time.perf_counter_ns() - t0) / 1000 / 1000.0)
        # a step beginning while a user's span is current: one attach
        t0 = time.perf_counter_ns()
        for _ in range(1000):
            token = otel_context.attach(trace.set_span_in_context(tracer.start_span("u")))
            hook.on_step_start(handle)
            otel_context.detach(token)
        attaches.append((time.perf_counter_ns() - t0) / 1000 / 1000.0)
    _patching.step_hooks = ()
    med = statistics.median
    print(f"rounds={args.rounds} block={args.block} load={os.getloadavg()[0]:.2f}")
    print(f"run_step without the hook: {med(off):.2f} us/step")
    print(f"run_step with the hook:    {med(on):.2f} us/step")
    print(f"hook cost: {med(b - a for a, b in zip(off, on)):.2f} us/step (median of pairs)")
    print(f"begin_step + first span-context read: {med(reads):.2f} us")
    print(f"user span + attach-on-top + detach: {med(attaches):.2f} us")


if __name__ == "__main__":
    main()
