"""The tables configs/generate.py writes the recipes from, one module per table (see its docstring)."""
