"""What the tests share: AGN's recipes with their references by hand, and
callbacks. Imports no TensorFlow and no test module or worker script."""

import keras
from reference import optimizers

INNER_LR = 0.1

# name: (AGNOptimizer's options, the inner optimizer and the outer one as
# Keras optimizers and by hand, tests/reference). The README's recipes.
RULES = {
    "contrib": (
        {},
        lambda: keras.optimizers.SGD(INNER_LR, momentum=0.9),
        lambda: optimizers.SGD(INNER_LR, 0.9),
        None,  # The default outer optimizer: a copy of the inner one.
        lambda: optimizers.SGD(INNER_LR, 0.9),
    ),
    "hermans": (
        {"commit": "weight_change"},
        lambda: keras.optimizers.Adam(INNER_LR),
        lambda: optimizers.Adam(INNER_LR),
        lambda: keras.optimizers.SGD(1.0),
        lambda: optimizers.SGD(1.0),
    ),
    "diloco": (
        {"commit": "weight_change", "normalize": False},
        lambda: keras.optimizers.AdamW(INNER_LR, weight_decay=0.1),
        lambda: optimizers.AdamW(INNER_LR, weight_decay=0.1),
        lambda: keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True),
        lambda: optimizers.SGD(0.7, 0.9, nesterov=True),
    ),
    "downpour": (
        {"commit": "weight_change", "normalize": False},
        lambda: keras.optimizers.SGD(INNER_LR),
        lambda: optimizers.SGD(INNER_LR),
        lambda: keras.optimizers.SGD(1.0),
        lambda: optimizers.SGD(1.0),
    ),
}


class InterruptAtEpoch(keras.callbacks.Callback):
    """Raises `RuntimeError("interrupted")` as epoch `epoch` begins: a
    crash, for the tests of `BackupAndRestore`."""

    def __init__(self, epoch=2):
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            raise RuntimeError("interrupted")
