"""The processes of a JAX run as workers: their mesh and the programs that
run on all of them (`workers`), the backup each writes (`backup`), a
failing or early-ending process ending them all (`exits`) and the runner
the launcher starts each with (`runner`). The `fit` that trains across
them is `keras_clones.jax_trainer.fitting`'s."""
