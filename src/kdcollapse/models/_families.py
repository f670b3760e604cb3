"""Imports every model family so that its ``@register_model`` entries run."""
