"""How a JAX process of several ends, so that the others end with it.

JAX's processes wait for each other: a peer in a collective waits for a
process that died until gloo notices, and a process at its end waits in
JAX's shutdown barrier (`jax.distributed.shutdown`, 300 s) for the
others. So one process that raised, or that ended early, used to hold
the run for about five minutes. With `install()` in every process:

- **A failure** (an exception that ends the process, from the main
  thread): its traceback is printed as Python prints it (the hook that
  was installed before is called), this process's record says it failed,
  and the process ends at once with code 1 (`os._exit`), skipping JAX's
  barrier. A peer in a collective then fails within a second or two
  ("Connection closed by peer") and ends the same way; a peer that
  starts a `fit` (`fit_started`) or is at its own end sees the record and
  ends at once.
- **An early end**: a process that ends, with any exit code, while a
  peer still running has started more `fit`s than this one (a
  `sys.exit(0)` before `fit`, say) would leave that peer waiting in the
  fit's collectives. It says so, naming the peer and the fit, and ends
  with code 1; the peer, at its fit's start or in its collective, fails
  as above.
- **A normal end** waits for the others to reach theirs (as JAX's
  barrier would, at most `END_TIMEOUT` s), then goes on to JAX's
  barrier, which they all reach at once.

Each process keeps its record (the fits it started, and how it ended)
in JAX's coordination service's key-value store, which gloo's
collectives do not block. `keras_clones.launch` runs each JAX process's
script through `runner`, which installs this first, so any script is
covered (a plain `keras.distribution.DataParallel` one included);
elsewhere `import keras_clones` installs it.
"""

import atexit
import json
import os
import sys
import threading
import time

# JAX's own shutdown barrier waits as long for every process.
END_TIMEOUT = 300.0
_POLL_INTERVAL = 0.05
# How long a failing process tries to leave its record (the coordination
# service may be gone with its host, process 0).
_RECORD_TIMEOUT = 2.0
_KEY = "keras_clones/exits/"
# What a peer's error says when it is the consequence of another process's
# end (the launcher's summary names the cause first).
CONSEQUENCE = "keras_clones: JAX process"


class _Record:
    """This process's record: the fits it started, and how it ended (""
    while it runs, "failed" or "ended")."""

    def __init__(self):
        self.started = 0
        self.ended = ""

    def as_text(self):
        return json.dumps({"started": self.started, "ended": self.ended})


_RECORD = _Record()
_INSTALLED = []
_DONE = []  # Whether this process's end was judged already.


def install():
    """Installs the failure hook (`sys.excepthook`, chaining the one there)
    and the end's rule (`atexit`), once per process. They act only where
    JAX runs several processes."""
    if _INSTALLED:
        return
    _INSTALLED.append(True)
    previous = sys.excepthook

    def hook(kind, value, traceback):
        previous(kind, value, traceback)
        if _client() is not None and not _DONE:
            fail()
        # One process alone: Python's own end.

    sys.excepthook = hook
    # Run before JAX's own end (its barrier), which JAX registered when it
    # was imported: `atexit` runs the handlers last registered first.
    atexit.register(end)


def _client():
    """JAX's client of the coordination service where JAX runs several
    processes (`jax.distributed` initialized), else None. JAX has no
    public access to its key-value store (this module's one private use
    of JAX; tests_jax/test_keras_internals.py checks it)."""
    if "jax" not in sys.modules:
        return None
    from jax._src import distributed

    return distributed.global_state.client


def _process():
    from jax._src import distributed

    state = distributed.global_state
    return state.process_id, state.num_processes


def _publish(client):
    index, _ = _process()
    client.key_value_set(
        f"{_KEY}{index}", _RECORD.as_text(), allow_overwrite=True
    )


def _peers(client):
    """Every other process's record that exists: {index: dict}."""
    index, _ = _process()
    records = {}
    for key, text in client.key_value_dir_get(_KEY):
        peer = int(key.rsplit("/", 1)[-1])
        if peer != index:
            records[peer] = json.loads(text)
    return records


def fit_started():
    """Notes that this process starts a `fit`; raises if a peer already
    ended without it (it failed, or ended after fewer fits), since the
    fit's collectives would wait for that peer."""
    client = _client()
    if client is None:
        return
    _RECORD.started += 1
    _publish(client)
    peers = _peers(client)
    early = [p for p, r in peers.items() if _ended_before(r, _RECORD.started)]
    if early:
        # It sees this record and says why it ended early (its error comes
        # first), then fails: wait for that before ending every process.
        deadline = time.monotonic() + _RECORD_TIMEOUT
        while time.monotonic() < deadline and not any(
            peers[p]["ended"] == "failed" for p in early
        ):
            time.sleep(_POLL_INTERVAL)
            peers = _peers(client)
    for peer, record in sorted(peers.items()):
        if record["ended"] == "failed":
            raise RuntimeError(
                f"{CONSEQUENCE} {peer} failed (see its error), so this "
                f"process's fit {_RECORD.started} would wait for it: every "
                "process ends."
            )
        if _ended_before(record, _RECORD.started):
            raise RuntimeError(
                f"{CONSEQUENCE} {peer} ended after {record['started']} "
                f"fit(s), before fit {_RECORD.started}, which this process "
                "starts: every process must run the same fits (its "
                "collectives would wait for the missing process)."
            )


def _ended_before(record, fit):
    """Whether a peer's `record` says it ended before starting `fit`."""
    return record["ended"] == "ended" and record["started"] < fit


def fail():
    """Ends this process at once, with code 1, its record saying it failed
    (a failure; see the module's docstring)."""
    _DONE.append(True)
    _RECORD.ended = "failed"
    client = _client()
    if client is not None:
        _publish_within(client, _RECORD_TIMEOUT)
    _exit_now(1)


def end():
    """The end of this process (`atexit`, or `runner` after the script):
    ends it with code 1 where it ends early, at once where a peer failed,
    else once the others reached their ends (see the module's
    docstring)."""
    if _DONE:
        return
    _DONE.append(True)
    client = _client()
    if client is None:
        return
    index, count = _process()
    _RECORD.ended = "ended"
    _publish(client)
    deadline = time.monotonic() + END_TIMEOUT
    while time.monotonic() < deadline:
        peers = _peers(client)
        for peer, record in sorted(peers.items()):
            if record["ended"] == "failed":
                # Its collectives are gone: JAX's barrier would wait for
                # it. This process's work is done.
                _exit_now(0)
            if not record["ended"] and record["started"] > _RECORD.started:
                fit = _RECORD.started + 1
                print(
                    f"RuntimeError: keras_clones: this JAX process ({index}) "
                    f"ended before fit {fit}, which process {peer} has "
                    "started: every process must run the same fits, "
                    f"or process {peer} would wait for this one in the "
                    "fit's collectives. Ending with code 1, and every "
                    "process with it.",
                    file=sys.stderr,
                    flush=True,
                )
                _RECORD.ended = "failed"
                _publish_within(client, _RECORD_TIMEOUT)
                _exit_now(1)
        if len(peers) == count - 1 and all(r["ended"] for r in peers.values()):
            return  # JAX's barrier: every process reaches it.
        time.sleep(_POLL_INTERVAL)


def _publish_within(client, timeout):
    """Leaves this process's record, waiting at most `timeout` s."""
    thread = threading.Thread(target=_publish, args=(client,), daemon=True)
    thread.start()
    thread.join(timeout)


def _exit_now(code):
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
