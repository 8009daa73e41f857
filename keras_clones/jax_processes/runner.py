"""`python -m keras_clones.jax_processes.runner SCRIPT [ARGS...]` runs
`SCRIPT` as `python SCRIPT ARGS` does, with `exits` installed first: how
`keras_clones.launch` starts each JAX process, so that a failure or an
early end of any script (a plain `keras.distribution.DataParallel` one
too) ends every process within seconds.
"""

import os
import runpy
import sys

import keras_clones


def main(argv):
    if not argv:
        sys.exit(f"usage: python -m {__spec__.name} SCRIPT [ARGS...]")
    script = argv[0]
    sys.argv = list(argv)
    # As `python SCRIPT` does: the script's folder first on the path.
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    sys.excepthook = _without_runner_frames(sys.excepthook)
    # Keras, JAX and keras_clones's `fit` (which notes each fit's start)
    # before the script; none of them starts JAX's backend.
    keras_clones.import_all()
    from keras_clones.jax_processes import exits

    exits.install()
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit:
        exits.end()
        raise
    exits.end()


def _without_runner_frames(hook):
    """`hook` on tracebacks that start in the script, as `python SCRIPT`
    prints them (without this module's and `runpy`'s frames)."""

    def trimmed(kind, value, traceback):
        while traceback is not None and _runs_the_script(traceback.tb_frame):
            traceback = traceback.tb_next
        # Python prints the exception's own traceback.
        hook(kind, value.with_traceback(traceback), traceback)

    return trimmed


def _runs_the_script(frame):
    name = frame.f_code.co_filename
    return name in (__file__, runpy.__file__) or name == "<frozen runpy>"


if __name__ == "__main__":
    main(sys.argv[1:])
