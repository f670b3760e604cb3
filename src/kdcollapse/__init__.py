"""kdcollapse: knowledge distillation and the geometry of what classifiers learn."""

import logging

__version__ = "0.1.0"

# A library adds no handler of its own: the per-epoch lines (logger "kdcollapse.train") reach a program
# only through the logging it configures; the command line adds a console handler.
logging.getLogger("kdcollapse").addHandler(logging.NullHandler())
