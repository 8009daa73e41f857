"""When an `AGNOptimizer`'s periods end: the one answer to "does this step
end a period, and whose?"."""

import typing

import keras


class Schedule(typing.NamedTuple):
    """The periods of `fragments` fragments, each `period` local steps
    long: fragment f's ends at local step `(f + 1) * period / fragments`
    of each period. With `delay` 1 (overlapped commits) a period's commit
    is applied at the end of the next one."""

    period: int
    fragments: int = 1
    delay: int = 0

    @property
    def share(self):
        """Local steps between two fragments' period ends."""
        return self.period // self.fragments

    def ending(self, step):
        """The one answer to "does local step `step` end a period, and
        whose?".

        Args:
            step: A local step (an integer tensor, counted from 1).

        Returns:
            A list of `(fragment, ends)`: each fragment's index, with a
            boolean tensor, whether its period ends at `step`.
        """
        if self.fragments == 1:
            return [(0, keras.ops.equal(step % self.period, 0))]
        share = self.share
        position = step % self.period
        at_a_share = keras.ops.equal(position % share, 0)
        fragment = (position // share - 1) % self.fragments
        return [
            (f, keras.ops.logical_and(at_a_share, keras.ops.equal(fragment, f)))
            for f in range(self.fragments)
        ]

    def ends_at_most_once(self, first, last):
        """Whether local steps after `first` up to `last` (tensors) cross
        no period's end but, at most, one at `last` itself (a boolean
        tensor): what an execution of the train function may do with
        overlapped commits."""
        share = keras.ops.convert_to_tensor(self.share, "int64")
        crossed = last // share - first // share
        at_a_share = keras.ops.equal(last % share, 0)
        return crossed <= keras.ops.cast(at_a_share, "int64")

    def synchronised_at(self, step):
        """Whether after `step` local steps (an int) the local weights are
        the centers by design: before the first step, and where every
        fragment's period ends at once with nothing in flight (one
        fragment, no delay, at a period's end)."""
        if step == 0:
            return True
        return (
            self.fragments == 1 and not self.delay and step % self.period == 0
        )
