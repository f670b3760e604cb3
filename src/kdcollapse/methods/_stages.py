"""Which stage maps a feature method reads: the ``stages`` / ``teacher_stages`` keys of its config."""

from __future__ import annotations

from kdcollapse.errors import ConfigError


def check_stages(config) -> None:
    """``stages`` non-empty and ``teacher_stages``, when given, as long (a :class:`ConfigError` otherwise)."""
    if not config.stages:
        raise ConfigError("method.stages must name at least one stage (feature_info index)")
    if config.teacher_stages is not None and len(config.teacher_stages) != len(config.stages):
        raise ConfigError(f"method.teacher_stages must pair with method.stages: got {config.teacher_stages} "
                          f"for {config.stages}")


def stage_channels(model, stages) -> list[int]:
    """The channels of ``model``'s ``stages`` (feature_info indices); a clear error for a missing stage."""
    info = model.feature_info
    for i in stages:
        if not -len(info) <= i < len(info):
            raise ConfigError(f"method.stages: stage {i} does not exist in {type(model).__name__}, which has "
                              f"{len(info)} stages (feature_info indices 0..{len(info) - 1})")
    return [info[i].channels for i in stages]
