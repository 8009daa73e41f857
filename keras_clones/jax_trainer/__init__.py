"""keras_clones's parts of Keras's JAX trainer: the methods it puts into
`JAXTrainer` and `keras.Model` when keras_clones is imported on JAX
(`overrides`), the stand-ins behind them (`fitting`: `fit` across JAX
processes, and an `AGNOptimizer`'s first step in one process), the train
function across processes (`train_function`), the period-end programs of
one process (`period_programs`) and the first step (`first_step`)."""
