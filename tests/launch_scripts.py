"""Tiny worker scripts for the launcher's tests (`test_launch*.py`): they
import no TensorFlow, and read their task index from `TF_CONFIG`."""

import os
import pathlib
import textwrap

import pytest

ROOT = pathlib.Path(__file__).parent.parent

# Every worker script starts with this: `index` is its task index.
PREAMBLE = """\
import json, os, signal, sys, time
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
"""


def write_script(tmp_path, body):
    path = tmp_path / "worker.py"
    path.write_text(PREAMBLE + textwrap.dedent(body))
    return str(path)


def worker_lines(out, index):
    prefix = f"[worker {index}] "
    return [
        line[len(prefix) :]
        for line in out.splitlines()
        if line.startswith(prefix)
    ]


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def assert_gone(pid):
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
