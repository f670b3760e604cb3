"""Imports every model family so that its ``@register_model`` entries run."""

from kdcollapse.models import (  # noqa: F401
    mobilenetv1,
    mobilenetv2,
    resnet_cifar,
    resnet_imagenet,
    shufflenetv1,
    shufflenetv2,
    small,
    vgg,
    wrn,
)
