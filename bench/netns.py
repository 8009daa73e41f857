"""Shaped links for the benchmarks: network namespaces and `tc` loopbacks.

A namespace's loopback behind a token bucket (`tc`'s `tbf`), shared by
every worker run in the namespace. Needs root, `ip` and `tc`; standard
library only. What and how: docs/benchmarks/slow_links.md#netns.

    with netns.Namespace() as namespace:
        namespace.shape(netns.LINKS["100mbit"])
        launching.run_process(namespace.command(["python", "train.py"]), 600)
"""

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

import launching

PREFIX = "keras-clones-bench"
_CAUGHT = (signal.SIGTERM, signal.SIGHUP)
# Set in the environment of the processes run with `Namespace.command`: the
# namespace they run in, for `shape_own_namespace`.
ENV = "KERAS_CLONES_BENCH_NETNS"
_KILL_TIMEOUT = 10.0


@dataclasses.dataclass(frozen=True)
class Link:
    """A loopback link: unshaped, or `tbf` at `rate` bits per second.

    Attributes:
        name: How tables name it, e.g. `"100 Mbit/s"`.
        rate: `tc`'s rate, e.g. `"100mbit"`; None for the unshaped loopback.
        burst: The bucket's size: bytes sent at once at full speed.
        latency: The queue's bound: the longest a byte may wait in it
            (`tbf` drops beyond it; it adds no delay).
    """

    name: str
    rate: str | None
    burst: str = "256kb"
    latency: str = "200ms"

    @property
    def bits_per_second(self):
        """The rate in bits per second; None when unshaped."""
        if self.rate is None:
            return None
        return launching.package_module("cost_model").parse_bandwidth(self.rate)

    @property
    def burst_bytes(self):
        """The bucket's size in bytes (`tc`'s units: kb = 1024 bytes)."""
        units = {"kb": 1024, "mb": 1024**2, "k": 1024, "m": 1024**2, "b": 1}
        for unit, scale in units.items():
            if self.burst.endswith(unit):
                return float(self.burst[: -len(unit)]) * scale
        raise ValueError(f"Unknown size unit in {self.burst!r}: use {units}.")

    def describe(self):
        """The rate, burst and queue bound, as a table's note says them."""
        if self.rate is None:
            return f"{self.name}: the loopback as it is, no qdisc"
        return (
            f"{self.name}: tbf rate {self.rate} burst {self.burst} "
            f"latency {self.latency}"
        )


UNSHAPED = Link("unshaped", None)
LINKS = {
    "unshaped": UNSHAPED,
    "1gbit": Link("1 Gbit/s", "1gbit", burst="1mb"),
    "100mbit": Link("100 Mbit/s", "100mbit"),
    # tbf queues rate x latency + burst: with 200 ms, 506 KB at 10 Mbit/s,
    # less than one worker's 1 MB share of a round; a longer bound keeps
    # tbf from dropping (and TCP from waiting out retransmission timeouts).
    "10mbit": Link("10 Mbit/s", "10mbit", latency="2s"),
}


def missing_requirements():
    """Why namespaces cannot be made here (one line), or None if they can."""
    if os.geteuid() != 0:
        return f"needs root to make network namespaces (uid {os.geteuid()})"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"needs {' and '.join(missing)} (iproute2) on the PATH"
    return None


def _output(*command):
    """The output of `command`, run whatever its exit status."""
    return subprocess.run(command, capture_output=True, text=True).stdout


def _run(*command):
    """Runs `command`; a RuntimeError with its stderr if it fails."""
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(
            f"`{' '.join(command)}` failed (exit status "
            f"{result.returncode}): {result.stderr.strip()}"
        )


def _tc_shape(link, prefix=()):
    """Shapes the loopback of the namespace `prefix` runs in."""
    tc = (*prefix, "tc", "qdisc")
    if link.rate is not None:
        tbf = ("tbf", "rate", link.rate, "burst", link.burst)
        _run(*tc, "replace", "dev", "lo", "root", *tbf, "latency", link.latency)
        return
    # Back to no qdisc: deleting none fails, so check what is left.
    _output(*tc, "del", "dev", "lo", "root")
    shown = _output(*tc, "show", "dev", "lo")
    if "tbf" in shown:
        raise RuntimeError(f"The loopback is still shaped: {shown}")


def shape_own_namespace(link):
    """Shapes the loopback of the namespace this process runs in.

    Only in a namespace a `Namespace` made (named in the environment by
    `Namespace.command`, and the one this process is in): the machine's own
    loopback is never touched.

    Raises:
        RuntimeError: This process is not in such a namespace.
    """
    expected = os.environ.get(ENV)
    current = None
    if expected:
        current = _output("ip", "netns", "identify", str(os.getpid())).strip()
    if not expected or current != expected:
        raise RuntimeError(
            f"Refusing to shape the loopback: this process runs in network "
            f"namespace {current or '(the machine own)'!r}, not in one made "
            f"by bench/netns.py ({ENV}={expected!r}). Start it with "
            f"Namespace.command(...)."
        )
    _tc_shape(link)


def leftovers():
    """The names of this module's namespaces that exist now."""
    lines = _output("ip", "netns", "list").splitlines()
    names = [line.split()[0] for line in lines if line.strip()]
    return [name for name in names if name.startswith(PREFIX)]


def sweep_stale():
    """Deletes this module's namespaces whose driver (the PID in the name)
    is gone: those of a driver killed by SIGKILL, which cannot clean up."""
    for name in leftovers():
        try:
            os.kill(int(name[len(PREFIX) + 1 :].split("-")[0]), 0)
        except ProcessLookupError:
            _delete(name)
        except PermissionError:
            pass


def _delete(name):
    """Kills every process in namespace `name`, then deletes it; a warning
    with the command to finish by hand if that fails."""
    deadline = time.monotonic() + _KILL_TIMEOUT
    while (pids := _pids(name)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    result = subprocess.run(
        ["ip", "netns", "del", name], capture_output=True, text=True
    )
    if pids or result.returncode != 0:
        print(
            f"bench/netns.py: could not clean up network namespace {name} "
            f"(processes left: {pids or 'none'}; {result.stderr.strip()}). "
            f"Run `ip netns pids {name} | xargs -r kill -9; ip netns del "
            f"{name}`.",
            file=sys.stderr,
            flush=True,
        )


def _pids(name):
    """The processes in namespace `name`."""
    return [int(pid) for pid in _output("ip", "netns", "pids", name).split()]


class _Terminated(BaseException):
    """SIGTERM or SIGHUP, raised so that the namespace is deleted."""


def _raise_terminated(signum, frame):
    raise _Terminated(f"signal {signum}")


class Namespace:
    """A network namespace with its loopback up, deleted on exit.

    Use it as a context manager. On leaving the block (normally, on an
    error, Ctrl-C, SIGTERM or SIGHUP), every process still in the namespace
    is killed, then the namespace is deleted; signals wait until that is
    done. Ctrl-C and the signals still end the program, after the clean-up.
    A driver killed outright (SIGKILL) cannot clean up: the next
    `Namespace` deletes what it left (`sweep_stale`).

    Attributes:
        name: The namespace's unique name (`keras-clones-bench-PID-XXXXXX`).
    """

    def __init__(self):
        problem = missing_requirements()
        if problem:
            raise RuntimeError(f"bench/netns.py {problem}.")
        self.name = f"{PREFIX}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._handlers = {}

    def __enter__(self):
        sweep_stale()
        for signum in _CAUGHT:
            self._handlers[signum] = signal.signal(signum, _raise_terminated)
        try:
            _run("ip", "netns", "add", self.name)
            _run(*self._inside(), "ip", "link", "set", "lo", "up")
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def shape(self, link):
        """Shapes the namespace's loopback to `link` (replacing any shape)."""
        _tc_shape(link, prefix=self._inside())

    def command(self, argv):
        """`argv`, run inside the namespace (with `ENV` naming it)."""
        return [*self._inside(), "env", f"{ENV}={self.name}", *argv]

    def _inside(self):
        return ("ip", "netns", "exec", self.name)

    def pids(self):
        """The processes in the namespace."""
        return _pids(self.name)

    def __exit__(self, exc_type, exc, traceback):
        # A second Ctrl-C or signal must not cut the clean-up short.
        interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)
        for signum in _CAUGHT:
            signal.signal(signum, signal.SIG_IGN)
        try:
            _delete(self.name)
        finally:
            signal.signal(signal.SIGINT, interrupt)
            for signum, handler in self._handlers.items():
                signal.signal(signum, handler)
            self._handlers = {}
        if isinstance(exc, _Terminated):
            raise SystemExit(1) from exc
        return False
