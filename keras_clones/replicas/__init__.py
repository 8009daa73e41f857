"""The backend seam under everything inside a step: where the parts of a
step run, how the workers reduce, and what a worker holds of its own.

A worker is a group of devices that takes its local steps together: on
TensorFlow (`strategy_replicas.StrategyReplicas`) one replica of the
current `tf.distribute` strategy; under Keras's other backends
(`keras_replicas.KerasReplicas`) the step itself in one process or under
`keras.distribution`, and, in a step traced across JAX processes, one
group along the workers' axis (`worker_axis`; today one device per
process). AGN's engine, its state builder, its optimizer, the workers'
own state (`keras_clones.agn.worker_state`) and the step hooks' verdict
(`keras_clones.step_hooks`) ask this seam, and name no backend.

Two questions are asked of a seam, and they differ: whether each worker
takes its local steps apart, on its own gradients (`steps_apart`), and
whether Keras divided each replica's gradients by the replicas
(`gradients_divided`: under `tf.distribute`, not on JAX).
"""

from keras_clones._tensorflow import ON_TENSORFLOW


def this_backend():
    """The seam of this backend, as a class: its static questions
    (`sum_over_workers`, `workers_now`, `own_copies`, ...)."""
    if ON_TENSORFLOW:
        from keras_clones.replicas.strategy_replicas import StrategyReplicas

        return StrategyReplicas
    from keras_clones.replicas.keras_replicas import KerasReplicas

    return KerasReplicas


def for_this_backend(writes):
    """The replicas of this backend's steps; `writes()` lists what a
    conditional update may assign where that must be said
    (`KerasReplicas`)."""
    return this_backend()(writes)
