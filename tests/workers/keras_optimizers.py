"""Every optimizer class in `keras.optimizers` but the wrappers and the
base, each with options that exercise its whole `apply` (clipping, weight
decay, schedules, its own state): what asynchronous AGN's inner optimizer
is tested with, on tensors and on parameter-server workers."""

import keras

OPTIMIZERS = {
    "SGD": lambda: keras.optimizers.SGD(
        0.05, momentum=0.9, nesterov=True, clipvalue=0.2
    ),
    "RMSprop": lambda: keras.optimizers.RMSprop(
        0.01, momentum=0.5, centered=True
    ),
    "Adam": lambda: keras.optimizers.Adam(0.01, amsgrad=True, clipnorm=0.5),
    "AdamW": lambda: keras.optimizers.AdamW(
        keras.optimizers.schedules.ExponentialDecay(0.02, 2, 0.5),
        weight_decay=0.1,
    ),
    "Adadelta": lambda: keras.optimizers.Adadelta(1.0),
    "Adagrad": lambda: keras.optimizers.Adagrad(0.1, global_clipnorm=0.3),
    "Adamax": lambda: keras.optimizers.Adamax(0.01),
    "Adafactor": lambda: keras.optimizers.Adafactor(0.01),
    "Nadam": lambda: keras.optimizers.Nadam(0.01),
    "Ftrl": lambda: keras.optimizers.Ftrl(
        0.1,
        l1_regularization_strength=0.01,
        l2_shrinkage_regularization_strength=0.01,
    ),
    "Lion": lambda: keras.optimizers.Lion(0.001),
    "Lamb": lambda: keras.optimizers.Lamb(0.01),
    "Muon": lambda: keras.optimizers.Muon(0.01),
    "ScheduleFreeAdamW": lambda: keras.optimizers.ScheduleFreeAdamW(0.01),
}
