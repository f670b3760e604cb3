"""kdcollapse: knowledge distillation and the geometry of what classifiers learn."""

__version__ = "0.1.0"
