"""`CloneModel` and its parts: the model on TensorFlow (`model`) and on
JAX (`jax_model`), built from inputs and outputs on either (`functional`),
its deployment (`deployment`: `DeploymentConfig`; on JAX, its devices:
`jax_devices`), and on TensorFlow the clones' forward and backward passes
(`clones`), replicated variables (`replication`), the distribution modes
(`modes`), a clone's reads of shared state (`clone_reads`), the counters it
logs (`counter_logs`) and one step computed and not yet applied
(`computed_step`: `ComputedStep`, which imports under any backend).
`keras_clones.CloneModel` is the face: each backend's model."""
