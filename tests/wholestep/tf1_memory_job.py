"""A TF1 Session.run loop whose step computes ``big`` (a [1000, 250] float32 product:
1,000,000 output bytes) and ``small`` ([4] float32: 16 bytes) (tests/wholestep). STEPS steps."""

from __future__ import annotations

import os

import tensorflow as tf

STEPS = int(os.environ.get("STEPS", "4"))


def main() -> None:
    tf.compat.v1.disable_eager_execution()
    x = tf.compat.v1.placeholder(tf.float32, [None], name="x")
    big = tf.multiply(tf.ones([1000, 250], tf.float32), x[0], name="big")
    small = tf.multiply(tf.ones([4], tf.float32), x[1], name="small")
    total = tf.reduce_sum(big) + tf.reduce_sum(small)
    with tf.compat.v1.Session() as sess:
        for _ in range(STEPS):
            sess.run(total, {x: [1.0, 2.0]})
    print(f"done steps={STEPS}", flush=True)


if __name__ == "__main__":
    main()
