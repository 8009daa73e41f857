"""When an `AGNOptimizer`'s periods end: the one answer to "does this step
end a period, and whose?"."""

import typing

import tensorflow as tf


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
        """The one answer to "does local step `step` (a tensor, counted
        from 1) end a period, and whose?": each fragment with a boolean
        tensor, whether its period ends there."""
        if self.fragments == 1:
            return [(0, tf.equal(step % self.period, 0))]
        share = self.share
        position = step % self.period
        at_a_share = tf.equal(position % share, 0)
        fragment = (position // share - 1) % self.fragments
        return [
            (f, tf.logical_and(at_a_share, tf.equal(fragment, f)))
            for f in range(self.fragments)
        ]

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
