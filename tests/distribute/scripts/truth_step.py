"""The custom-loop step of the tf.distribute test scripts, with the in-process truth: after each
replica's gradients are computed and before their all-reduce, ``mark(replica id)`` runs (a
stateful ``tf.numpy_function``; it returns a float32 and records when it ran); with ``applied``,
the same once the replica's variables hold the update (after the all-reduce). The two bracket
the replica's arrival at the all-reduce: after ``mark``, before ``applied`` (the executor may
start the collective a few ms after ``mark`` on a loaded host).

Usage (next to the script: its folder is on sys.path)::

    from truth_step import train_step_with_truth
    train_step = train_step_with_truth(tf, strategy, model, optimizer, mark, applied=None)
    train_step(next(distributed_iterator))
"""


def train_step_with_truth(tf, strategy, model, optimizer, mark, applied=None):
    @tf.function
    def train_step(inputs):
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
            grads = tape.gradient(loss, model.trainable_variables)
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            with tf.control_dependencies(grads):  # the truth: gradients ready, before the reduce
                stamp = tf.numpy_function(mark, [replica], tf.float32, stateful=True)
            with tf.control_dependencies([stamp]):
                grads = [tf.identity(g) for g in grads]
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            if applied is not None:  # reads after the updates (automatic control dependencies)
                updated = [v.read_value() for v in model.trainable_variables]
                with tf.control_dependencies(updated):
                    done = tf.numpy_function(applied, [replica], tf.float32, stateful=True)
                with tf.control_dependencies([done]):
                    loss = tf.identity(loss)
            return loss

        return strategy.run(replica_step, args=inputs)

    return train_step
