"""`python -m keras_clones.cost_model`: the cost model's command line
(`command.main`)."""

import sys

from keras_clones.cost_model.command import main

sys.exit(main())
