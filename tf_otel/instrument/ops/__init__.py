"""Op-level tracing: the step hook that traces chosen steps (``hook``) and the on-demand
endpoint that asks for them (``admin``: HTTP on 127.0.0.1 and SIGUSR2, rank 0).

``hook`` hands ``admin`` its request and status functions when it registers; ``admin`` imports
nothing of op tracing, so the two never import each other.

Usage::

    from tf_otel.instrument.ops import hook
    hook.register()            # done by TensorFlowInstrumentor when TF_OTEL_OPS_* asks for it
    hook.request(steps=5)      # any rank, any thread: trace the next 5 steps on every rank
"""
