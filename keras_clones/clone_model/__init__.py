"""`CloneModel` and its parts: the model (`model`), its deployment
(`deployment`: `DeploymentConfig`), the clones' forward and backward passes
(`clones`), replicated variables (`replication`), the distribution modes
(`modes`), a clone's reads of shared state (`clone_reads`), the counters it
logs (`counter_logs`), one step computed and not yet applied
(`computed_step`: `ComputedStep`) and the clone devices on Keras's JAX
backend (`jax_devices`). TensorFlow only, except `computed_step`,
`deployment` and `jax_devices`; `keras_clones.CloneModel` is the face."""
