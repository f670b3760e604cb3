"""``kdcollapse models [list]``: the registered models with their sizes."""

from __future__ import annotations

_EXAMPLES = """examples:
  kdcollapse models                         # every model, parameters with 100 classes
  kdcollapse models list 'resnet*' --classes 10
  kdcollapse models list wrn_40_2 --in-channels 1
  kdcollapse models convert --from mdistiller --model resnet32x4 ckpt_epoch_240.pth resnet32x4.safetensors
  kdcollapse models convert --from mdistiller cifar_teachers.tar runs/cifar100   # every teacher_<model>/ of the tar
"""


def register(subparsers) -> None:
    from kdcollapse.cli._common import HelpFormatter, positive_int

    p = subparsers.add_parser("models", help="List the registered models; convert community weights.",
                              description="List the registered models with their parameter counts and "
                              "feature dimensions (`models list`, the default).", epilog=_EXAMPLES,
                              formatter_class=HelpFormatter)
    p.set_defaults(func=_run, pattern="*", classes=100, in_channels=3)
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    q = actions.add_parser("list", help="registered models (shell-style PATTERN)", formatter_class=HelpFormatter)
    q.add_argument("pattern", nargs="?", default="*", help="shell-style name pattern")
    q.add_argument("--classes", type=positive_int, default=100, help="number of classes of the head")
    q.add_argument("--in-channels", type=positive_int, default=3, help="input channels (1 for grey images)")
    q.set_defaults(func=_run)
    c = actions.add_parser("convert", help="community weights (mdistiller/CRD, timm) into a zoo model file",
                           description="Convert a .pth/.pt state dict (read with weights_only=True) of the "
                           "mdistiller/CRD CIFAR layout or timm's ImageNet ResNets into a zoo model file; use it "
                           "as teacher.checkpoint=OUT. From mdistiller's released cifar_teachers.tar (--from "
                           "mdistiller, INPUT a .tar): every teacher in it (or the --model one) into "
                           "OUTPUT/teacher_<model>/model.safetensors, read in memory, nothing extracted; with "
                           "OUTPUT runs/cifar100 these are the teachers the CIFAR-100 recipes and "
                           "studies/papers read.", formatter_class=HelpFormatter)
    c.add_argument("--from", dest="source", required=True, choices=["mdistiller", "timm"],
                   help="the weights' layout (mdistiller also covers CRD's cifar_teachers)")
    c.add_argument("--model", help="the zoo's name of the architecture, e.g. resnet32x4 (required but for a .tar, "
                   "where it picks one teacher)")
    c.add_argument("input", help="the community weights (.pth, .pt or .safetensors), or mdistiller's "
                   "cifar_teachers.tar")
    c.add_argument("output", help="the zoo model file to write (.safetensors); for a .tar, a folder")
    c.set_defaults(func=_convert)


def _run(args) -> int:
    from kdcollapse.errors import KdcollapseError
    from kdcollapse.models import count_parameters, create_model, list_models

    names = list_models(args.pattern)
    if not names:
        raise KdcollapseError(f"no model matches {args.pattern!r}; valid names: {', '.join(list_models())}")
    print(f"{'model':<16} {'parameters':>12} {'feature_dim':>11}   ({args.classes} classes, "
          f"{args.in_channels} input channels)")
    for name in names:
        model = create_model(name, args.classes, in_channels=args.in_channels)
        print(f"{name:<16} {count_parameters(model):>12,} {model.feature_dim:>11}")
    return 0


def _convert(args) -> int:
    from kdcollapse.cli._common import check_output
    from kdcollapse.runs import convert_weights

    from kdcollapse.errors import KdcollapseError, unknown_choice
    from kdcollapse.models import list_models

    if str(args.input).endswith(".tar"):
        return _convert_archive(args)
    if args.model is None:
        raise KdcollapseError("--model is required (the zoo's name of the architecture, e.g. resnet32x4) unless "
                              "INPUT is mdistiller's cifar_teachers.tar")
    if args.model not in list_models():
        raise KdcollapseError(unknown_choice("--model", args.model, list_models()))
    check_output(args.output, "OUTPUT", suffixes=(".safetensors",))
    meta = convert_weights(args.input, args.output, source=args.source, model_name=args.model)
    print(f"{args.output}: {meta['model']}, {meta['num_classes']} classes, {meta['in_channels']} input channels "
          f"(from {args.source} weights {args.input}); use teacher.checkpoint={args.output}")
    return 0


def _convert_archive(args) -> int:
    from pathlib import Path

    from kdcollapse.cli._common import check_output
    from kdcollapse.errors import KdcollapseError, unknown_choice
    from kdcollapse.models import MDISTILLER_TEACHERS
    from kdcollapse.runs import convert_archive

    if args.source != "mdistiller":
        raise KdcollapseError(f"--from {args.source}: a .tar is read as mdistiller's cifar_teachers.tar; give "
                              "--from mdistiller")
    teachers = sorted(set(MDISTILLER_TEACHERS.values()))
    if args.model is not None and args.model not in teachers:
        raise KdcollapseError(unknown_choice("--model (a teacher of cifar_teachers.tar)", args.model, teachers))
    if not Path(args.input).is_file():
        raise KdcollapseError(f"no archive {args.input}")
    check_output(args.output, "OUTPUT", folder=True)
    written = convert_archive(args.input, args.output, models=None if args.model is None else [args.model])
    for name, meta in written.items():
        print(f"{Path(args.output) / f'teacher_{name}'}: {name}, {meta['num_classes']} classes "
              f"(from {meta['source_file']})")
    return 0
