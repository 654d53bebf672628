"""``tf_otel.batch.size`` as a Keras fit / evaluate / predict call states it (arrays, the
argument); the tf.data ``batch()`` case is checked on the real Keras run in
test_between_steps_io.py."""

from __future__ import annotations

import numpy as np

from tf_otel.instrument.keras import batch_size_of


def test_the_argument_wins():
    x = np.zeros((64, 4))
    assert batch_size_of("fit", (x, x), {"batch_size": 16}) == 16
    assert batch_size_of("fit", (x, x, 8), {}) == 8
    assert batch_size_of("predict", (x, 2), {}) == 2
    assert batch_size_of("evaluate", (), {"x": x, "batch_size": 5}) == 5


def test_arrays_without_batch_size_take_keras_default():
    x = np.zeros((64, 4))
    assert batch_size_of("fit", (x, x), {}) == 32
    assert batch_size_of("predict", (), {"x": [x, x]}) == 32


def test_unknown_input_gives_none():
    assert batch_size_of("fit", (), {}) is None
    assert batch_size_of("fit", (iter(range(3)),), {}) is None  # a generator-like iterator
    assert batch_size_of("fit", (np.zeros(3),), {"batch_size": 0}) is None
