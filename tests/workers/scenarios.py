"""Runs the scenarios of several worker scripts in one process, so that one
launch of 2 workers serves them all (each process imports TensorFlow and
joins the cluster once); see tests/test_multi_worker.py.

`scenarios.py OUT NAME...`, on each worker of a launch: each script NAME's
`worker(OUT, task index)` in turn, or its `main()` where it has no
`worker`. `scenarios.py OUT --reference NAME...`: each NAME's
`reference(OUT)`, in one process.
"""

import gc
import importlib
import sys

# First: it splits the CPU into logical devices before TensorFlow starts.
import common


def main():
    out = sys.argv[1]
    names = [a for a in sys.argv[2:] if a != "--reference"]
    for name in names:
        scenario = importlib.import_module(name)
        if "--reference" in sys.argv:
            scenario.reference(out)
        elif hasattr(scenario, "worker"):
            scenario.worker(out, common.task_index())
        else:
            scenario.main()
        # What is alive after a scenario (the strategy, traced functions)
        # is left out of later collections: the next scenarios run faster
        # (the launch of tests/test_multi_worker.py: 70-72 s instead of
        # 76-78 s, alone).
        gc.collect()
        gc.freeze()
        print(f"scenario {name} done", flush=True)


if __name__ == "__main__":
    main()
