"""AGN across JAX processes: Keras's `fit` of a model compiled with an
`AGNOptimizer`, each process a worker (see `fitting`)."""
