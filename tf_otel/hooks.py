"""Step hooks of your own: code run on the training thread at the start and end of every step
tf_otel traces, with the step's handle (its span's attributes, its timing) in hand.

Usage::

    from tf_otel.hooks import StepCall, StepHandle, StepHook, add_step_hook

    class Tokens(StepHook[None]):
        def on_step_start(self, handle: StepHandle, call: StepCall) -> None:
            handle.attributes["train.tokens"] = 4096   # on this step's span

    add_step_hook(Tokens())       # every step from now on; remove_step_hook(hook) to stop

docs/guides/HOOKS.md says what a hook may read and write; examples/step_hook.py runs one.
Importing this module never imports TensorFlow.
"""

from __future__ import annotations

from tf_otel.instrument._patching import (
    Error,
    HookOrder,
    StepCall,
    StepHook,
    add_step_hook,
    remove_step_hook,
)
from tf_otel.step_handle import StepHandle

StepError = Error  # what the step raised (None: it returned), as on_step_end gets it

__all__ = [
    "HookOrder",
    "StepCall",
    "StepError",
    "StepHandle",
    "StepHook",
    "add_step_hook",
    "remove_step_hook",
]
