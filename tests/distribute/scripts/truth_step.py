"""The custom-loop step of the tf.distribute test scripts, with the in-process truth: after each
replica's gradients are computed and before their all-reduce, ``mark(replica id)`` runs (a
stateful ``tf.numpy_function``; it returns a float32 and records when it ran).

Usage (next to the script: its folder is on sys.path)::

    from truth_step import train_step_with_truth
    train_step = train_step_with_truth(tf, strategy, model, optimizer, mark)
    train_step(next(distributed_iterator))
"""


def train_step_with_truth(tf, strategy, model, optimizer, mark):
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
            return loss

        return strategy.run(replica_step, args=inputs)

    return train_step
