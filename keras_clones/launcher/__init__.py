"""The local launcher's parts (`python -m keras_clones.launch`): its
processes (`processes`), a run of workers with its restarts (`workers`),
parameter servers beside a coordinator (`parameter_servers`); what a process
prints is `keras_clones.launcher.worker_output`'s. Standard library only: the
launcher imports neither Keras nor TensorFlow."""
