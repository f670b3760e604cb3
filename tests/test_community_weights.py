"""Community teachers: .pth state dicts read safely, mdistiller/CRD and timm layouts converted into the zoo.

The official modules are re-stated here from their published definitions (mdistiller
``mdistiller/models/cifar/{resnet,resnetv2,wrn,vgg,mobilenetv2,ShuffleNetv1,ShuffleNetv2}.py``, timm's
``resnet.py``) with their exact key names; a converted zoo model must give the same logits as the official module with the same weights.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kdcollapse.cli import main
from kdcollapse.errors import CheckpointError
from kdcollapse.models import convert_state_dict, create_model
from kdcollapse.runs import load_model

torch.set_grad_enabled(True)


def conv_bn(cin, cout, k, stride=1):
    return nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout)


class Basic(nn.Module):
    """mdistiller resnet.py / timm BasicBlock: conv1 bn1 conv2 bn2 [downsample.0/1]."""

    expansion = 1

    def __init__(self, cin, planes, stride, shortcut_name):
        super().__init__()
        self.conv1, self.bn1 = conv_bn(cin, planes, 3, stride)
        self.conv2, self.bn2 = conv_bn(planes, planes, 3)
        self.shortcut_name = shortcut_name
        if stride != 1 or cin != planes:
            setattr(self, shortcut_name, nn.Sequential(*conv_bn(cin, planes, 1, stride)))

    def skip(self, x):
        layer = getattr(self, self.shortcut_name, None)
        return x if layer is None else layer(x)

    def forward(self, x):
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(out + self.skip(x))


class Bottle(Basic):
    """resnetv2.py / timm Bottleneck: conv1 1x1, conv2 3x3 (stride), conv3 1x1 (x4), shortcut/downsample."""

    expansion = 4

    def __init__(self, cin, planes, stride, shortcut_name):
        nn.Module.__init__(self)
        self.conv1, self.bn1 = conv_bn(cin, planes, 1)
        self.conv2, self.bn2 = conv_bn(planes, planes, 3, stride)
        self.conv3, self.bn3 = conv_bn(planes, 4 * planes, 1)
        self.shortcut_name = shortcut_name
        if stride != 1 or cin != 4 * planes:
            setattr(self, shortcut_name, nn.Sequential(*conv_bn(cin, 4 * planes, 1, stride)))

    def forward(self, x):
        out = F.relu(self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))
        return F.relu(self.bn3(self.conv3(out)) + self.skip(x))


class OfficialResNet(nn.Module):
    """conv1 bn1 (maxpool) layer1..N fc/linear: mdistiller resnet.py (CIFAR, BasicBlock, `downsample`),
    resnetv2.py (ResNet50, Bottleneck, `shortcut`, `linear`) and timm (7x7 stem, max-pool, `downsample`)."""

    def __init__(self, block, depths, widths, stem, num_classes, imagenet=False, shortcut="downsample",
                 head="fc"):
        super().__init__()
        self.conv1, self.bn1 = conv_bn(3, stem, 7 if imagenet else 3, 2 if imagenet else 1)
        self.imagenet, self.head_name = imagenet, head
        cin = stem
        for i, (depth, width) in enumerate(zip(depths, widths)):
            blocks = []
            for j in range(depth):
                blocks.append(block(cin, width, 2 if i > 0 and j == 0 else 1, shortcut))
                cin = width * block.expansion
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
        self.depth = len(depths)
        setattr(self, head, nn.Linear(cin, num_classes))

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        if self.imagenet:
            x = F.max_pool2d(x, 3, 2, 1)
        for i in range(self.depth):
            x = getattr(self, f"layer{i + 1}")(x)
        return getattr(self, self.head_name)(x.mean((2, 3)))


class WrnBlock(nn.Module):
    """mdistiller wrn.py BasicBlock: bn1 conv1 bn2 conv2 [convShortcut on the pre-activated input]."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.equal = cin == cout
        self.convShortcut = None if self.equal else nn.Conv2d(cin, cout, 1, stride, 0, bias=False)

    def forward(self, x):
        a = F.relu(self.bn1(x))
        out = self.conv2(F.relu(self.bn2(self.conv1(a))))
        return out + (x if self.equal else self.convShortcut(a))


class OfficialWRN(nn.Module):
    """mdistiller wrn.py WideResNet: conv1, block{1,2,3}.layer.N, bn1, fc."""

    def __init__(self, depth, widen, num_classes):
        super().__init__()
        n, ch = (depth - 4) // 6, [16, 16 * widen, 32 * widen, 64 * widen]
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        for i in range(3):
            layer = nn.Sequential(*[WrnBlock(ch[i] if j == 0 else ch[i + 1], ch[i + 1], (1 if i == 0 else 2) if j == 0
                                             else 1) for j in range(n)])
            block = nn.Module()
            block.layer = layer
            setattr(self, f"block{i + 1}", block)
        self.bn1 = nn.BatchNorm2d(ch[3])
        self.fc = nn.Linear(ch[3], num_classes)

    def forward(self, x):
        x = self.conv1(x)
        for i in range(3):
            x = getattr(self, f"block{i + 1}").layer(x)
        return self.fc(F.relu(self.bn1(x)).mean((2, 3)))


class OfficialVGG(nn.Module):
    """mdistiller vgg.py VGG with batch_norm: block{0..4} of conv(bias)-BN-ReLU, 2x2 pools after blocks
    0-2 (block 3's pool only at 64x64), average pool, classifier."""

    def __init__(self, stages, num_classes):
        super().__init__()
        cin = 3
        for i, stage in enumerate(stages):
            layers = []
            for width in stage:
                layers += [nn.Conv2d(cin, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU()]
                cin = width
            setattr(self, f"block{i}", nn.Sequential(*layers[:-1]))
        self.classifier = nn.Linear(512, num_classes)

    def forward(self, x):
        for i in range(5):
            x = F.relu(getattr(self, f"block{i}")(x))
            if i < 3:
                x = F.max_pool2d(x, 2)
        return self.classifier(x.mean((2, 3)))


class OfficialMobileNetV2(nn.Module):
    """mdistiller mobilenetv2.py's mobile_half (t = 6, width 0.5): conv1 (conv, bn, relu), blocks[i][j].conv (1x1,
    bn, relu, 3x3 depthwise, bn, relu, 1x1, bn), conv2 (1x1 to 1280, bn, relu), classifier.0 (Linear)."""

    def __init__(self, num_classes, t=6, width=0.5):
        super().__init__()

        def conv(cin, cout, k, stride=1, groups=1, relu=True):
            layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
            return layers + [nn.ReLU()] * relu

        cin = int(32 * width)
        self.conv1 = nn.Sequential(*conv(3, cin, 3, 2))
        self.blocks, self.shortcut = nn.ModuleList(), []
        for ratio, c, n, s in [(1, 16, 1, 1), (t, 24, 2, 1), (t, 32, 3, 2), (t, 64, 4, 2), (t, 96, 3, 1),
                               (t, 160, 3, 2), (t, 320, 1, 1)]:
            stage = []
            for stride in [s] + [1] * (n - 1):
                block, hidden = nn.Module(), cin * ratio
                block.conv = nn.Sequential(*conv(cin, hidden, 1), *conv(hidden, hidden, 3, stride, groups=hidden),
                                           *conv(hidden, int(c * width), 1, relu=False))
                block.residual = stride == 1 and cin == int(c * width)
                stage.append(block)
                cin = int(c * width)
            self.blocks.append(nn.Sequential(*stage))
        self.conv2 = nn.Sequential(*conv(cin, 1280, 1))
        self.classifier = nn.Sequential(nn.Linear(1280, num_classes))

    def forward(self, x):
        x = self.conv1(x)
        for stage in self.blocks:
            for block in stage:
                x = x + block.conv(x) if block.residual else block.conv(x)
        return self.classifier(self.conv2(x).mean((2, 3)))  # AvgPool2d(2) of the 2x2 map


def channel_shuffle(x, groups):
    n, c, h, w = x.shape
    return x.reshape(n, groups, c // groups, h, w).transpose(1, 2).reshape(n, c, h, w)


class OfficialShuffleV2(nn.Module):
    """mdistiller ShuffleNetv2.py's ShuffleV2 (net size 1): conv1/bn1 (1x1 stem), layerN.0 a down block (conv1-bn1
    depthwise stride 2 and conv2-bn2 on the left, conv3-bn3, conv4-bn4 depthwise stride 2, conv5-bn5 on the right),
    then basic blocks (conv1-bn1, conv2-bn2 depthwise, conv3-bn3 on the second half of the split), conv2/bn2 (1x1 to
    1024), linear."""

    def __init__(self, num_classes, widths=(116, 232, 464, 1024), blocks=(3, 7, 3)):
        super().__init__()

        def unit(module, index, cin, cout, k, stride=1, depthwise=False):
            setattr(module, f"conv{index}", nn.Conv2d(cin, cout, k, stride, k // 2, bias=False,
                                                     groups=cin if depthwise else 1))
            setattr(module, f"bn{index}", nn.BatchNorm2d(cout))

        unit(self, 1, 3, 24, 1)
        cin = 24
        for i, (width, n) in enumerate(zip(widths[:3], blocks), 1):
            down, half = nn.Module(), width // 2
            unit(down, 1, cin, cin, 3, 2, depthwise=True)
            unit(down, 2, cin, half, 1)
            unit(down, 3, cin, half, 1)
            unit(down, 4, half, half, 3, 2, depthwise=True)
            unit(down, 5, half, half, 1)
            layer = [down]
            for _ in range(n):
                block = nn.Module()
                unit(block, 1, half, half, 1)
                unit(block, 2, half, half, 3, depthwise=True)
                unit(block, 3, half, half, 1)
                layer.append(block)
            setattr(self, f"layer{i}", nn.Sequential(*layer))
            cin = width
        unit(self, 2, cin, widths[3], 1)
        self.linear = nn.Linear(widths[3], num_classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        for i in (1, 2, 3):
            down, *rest = getattr(self, f"layer{i}")
            left = F.relu(down.bn2(down.conv2(down.bn1(down.conv1(x)))))
            right = F.relu(down.bn5(down.conv5(down.bn4(down.conv4(F.relu(down.bn3(down.conv3(x))))))))
            x = channel_shuffle(torch.cat([left, right], 1), 2)
            for b in rest:
                keep, work = x.chunk(2, 1)
                work = F.relu(b.bn3(b.conv3(b.bn2(b.conv2(F.relu(b.bn1(b.conv1(work))))))))
                x = channel_shuffle(torch.cat([keep, work], 1), 2)
        return self.linear(F.relu(self.bn2(self.conv2(x))).mean((2, 3)))  # avg_pool2d(4) of the 4x4 map


class OfficialShuffleV1(nn.Module):
    """mdistiller ShuffleNetv1.py's ShuffleV1 (groups 3, widths 240/480/960, 4/8/4 blocks): conv1/bn1 (1x1 stem),
    bottlenecks conv1-bn1 (grouped 1x1; 1 group on the 24-channel stem), shuffle, conv2-bn2 (depthwise 3x3),
    conv3-bn3 (grouped 1x1), a 3x3 stride-2 average pool concatenated at each stage's first block, linear."""

    def __init__(self, num_classes, widths=(240, 480, 960), blocks=(4, 8, 4), groups=3):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 24, 1, bias=False), nn.BatchNorm2d(24)
        cin = 24
        for i, (width, n) in enumerate(zip(widths, blocks), 1):
            layer = []
            for j in range(n):
                out = width - cin if j == 0 else width
                block, mid, g = nn.Module(), out // 4, 1 if cin == 24 else groups
                block.conv1, block.bn1 = nn.Conv2d(cin, mid, 1, groups=g, bias=False), nn.BatchNorm2d(mid)
                block.conv2 = nn.Conv2d(mid, mid, 3, 2 if j == 0 else 1, 1, groups=mid, bias=False)
                block.bn2 = nn.BatchNorm2d(mid)
                block.conv3, block.bn3 = nn.Conv2d(mid, out, 1, groups=groups, bias=False), nn.BatchNorm2d(out)
                block.g, block.down = g, j == 0
                layer.append(block)
                cin = width
            setattr(self, f"layer{i}", nn.Sequential(*layer))
        self.linear = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        for i in (1, 2, 3):
            for b in getattr(self, f"layer{i}"):
                out = channel_shuffle(F.relu(b.bn1(b.conv1(x))), b.g)
                out = b.bn3(b.conv3(F.relu(b.bn2(b.conv2(out)))))
                x = F.relu(torch.cat([out, F.avg_pool2d(x, 3, 2, 1)], 1) if b.down else out + x)
        return self.linear(x.mean((2, 3)))  # avg_pool2d(4) of the 4x4 map


K = 10
OFFICIAL = {  # zoo name -> (layout, the official module for k classes, input size)
    "resnet32x4": ("mdistiller", lambda k=K: OfficialResNet(Basic, [5] * 3, [64, 128, 256], 32, k), 32),
    "resnet56": ("mdistiller", lambda k=K: OfficialResNet(Basic, [9] * 3, [16, 32, 64], 16, k), 32),
    "resnet110": ("mdistiller", lambda k=K: OfficialResNet(Basic, [18] * 3, [16, 32, 64], 16, k), 32),
    "resnet50_cifar": ("mdistiller", lambda k=K: OfficialResNet(Bottle, [3, 4, 6, 3], [64, 128, 256, 512], 64, k,
                                                                shortcut="shortcut", head="linear"), 32),
    "wrn_40_2": ("mdistiller", lambda k=K: OfficialWRN(40, 2, k), 32),
    "vgg13": ("mdistiller", lambda k=K: OfficialVGG([[64, 64], [128, 128], [256, 256], [512, 512], [512, 512]], k),
              32),
    "mobilenetv2": ("mdistiller", lambda k=K: OfficialMobileNetV2(k), 32),
    "shufflev1": ("mdistiller", lambda k=K: OfficialShuffleV1(k), 32),
    "shufflev2": ("mdistiller", lambda k=K: OfficialShuffleV2(k), 32),
    "resnet18": ("timm", lambda k=K: OfficialResNet(Basic, [2] * 4, [64, 128, 256, 512], 64, k, imagenet=True), 64),
}


def official(name, seed=0, num_classes=K):
    """The official module with random weights and BN statistics, in eval mode."""
    torch.manual_seed(seed)
    layout, build, size = OFFICIAL[name]
    net = build(num_classes)
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.1, 0.1)
    return net.eval(), layout, torch.rand(2, 3, size, size)


@pytest.mark.parametrize("name", list(OFFICIAL))
def test_converted_teacher_gives_the_official_logits(name):
    net, layout, x = official(name)
    model = create_model(name, K).eval()
    model.load_state_dict(convert_state_dict({"model": net.state_dict(), "epoch": 240}, model, layout))
    with torch.no_grad():
        torch.testing.assert_close(model(x), net(x), rtol=1e-4, atol=1e-4)


def test_cli_convert_into_a_teacher_directory(tmp_path, capsys):
    net, layout, x = official("resnet56")
    src, dst = tmp_path / "ckpt_epoch_240.pth", tmp_path / "teacher_resnet56" / "model.safetensors"
    torch.save({"model": net.state_dict(), "epoch": 240, "best_acc": 72.3}, src)
    assert main(["models", "convert", "--from", "mdistiller", "--model", "resnet56", str(src), str(dst)]) == 0
    assert "use teacher.checkpoint=" in capsys.readouterr().out
    model, meta = load_model(dst.parent)  # what a recipe's teacher.checkpoint: runs/.../teacher_resnet56 reads
    assert (meta["model"], meta["num_classes"], meta["converted_from"]) == ("resnet56", K, "mdistiller")
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x), net(x), rtol=1e-4, atol=1e-4)


def test_another_architecture_is_refused():
    net, _, _ = official("resnet56")
    with pytest.raises(CheckpointError, match="another architecture"):
        convert_state_dict(net.state_dict(), create_model("resnet110", K), "mdistiller")
    with pytest.raises(CheckpointError, match=r"conv1.weight \(16, 3, 3, 3\) does not fit body.0.0.weight"):
        convert_state_dict(net.state_dict(), create_model("resnet56", K, in_channels=1), "mdistiller")
    with pytest.raises(CheckpointError, match="fc.weight .* does not fit head.weight"):
        convert_state_dict(net.state_dict(), create_model("resnet56", 100), "mdistiller")
    with pytest.raises(CheckpointError, match="unknown weights layout 'crd'"):
        convert_state_dict(net.state_dict(), create_model("resnet56", K), "crd")


def test_pth_state_dicts_load_with_weights_only(tmp_path):
    model = create_model("resnet8", K)
    path = tmp_path / "resnet8.pth"
    torch.save(model.state_dict(), path)
    loaded, meta = load_model(path, model_name="resnet8", num_classes=K)
    assert meta == {} and all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(),
                                                                  model.state_dict().values()))
    pickled = tmp_path / "whole_model.pth"
    torch.save(model, pickled)  # a pickled module: refused, never unpickled
    with pytest.raises(CheckpointError, match="weights_only=True.*save model.state_dict"):
        load_model(pickled, model_name="resnet8", num_classes=K)
    community = tmp_path / "community.pth"
    torch.save(official("resnet56")[0].state_dict(), community)
    with pytest.raises(CheckpointError, match="do not fit"):
        load_model(community, model_name="resnet56", num_classes=K)


def test_plain_module_weights_load_with_their_own_keys(tmp_path, monkeypatch):
    """A user's module registered as a model: its own state dict (no `module.` prefix) is accepted."""
    from kdcollapse.models import _MODELS, ModelInfo

    monkeypatch.setitem(_MODELS._entries, "byo_official_wrn", ModelInfo(
        "byo_official_wrn", lambda num_classes, in_channels=3: OfficialWRN(16, 1, num_classes)))
    net = OfficialWRN(16, 1, K)
    torch.save(net.state_dict(), tmp_path / "wrn.pt")
    model, _ = load_model(tmp_path / "wrn.pt", model_name="byo_official_wrn", num_classes=K)
    assert torch.equal(model.module.fc.weight, net.fc.weight)


# The folders of mdistiller's released cifar_teachers.tar (megvii-research/mdistiller, release "checkpoints":
# cifar_teachers/<folder>/ckpt_epoch_240.pth, the paths of mdistiller/models/cifar/__init__.py's cifar_model_dict).
RELEASE_FOLDERS = {"resnet56": "resnet56_vanilla", "resnet110": "resnet110_vanilla", "resnet32x4": "resnet32x4_vanilla",
                   "resnet50_cifar": "ResNet50_vanilla", "wrn_40_2": "wrn_40_2_vanilla", "vgg13": "vgg13_vanilla"}


def write_cifar_teachers_tar(path, names=tuple(RELEASE_FOLDERS)):
    """A tar of the release's layout: per teacher a CRD training checkpoint (``{"epoch", "model", "accuracy",
    "optimizer"}``, as CRD's train_teacher.py saves it) of the official 100-class module; returns name -> (module,
    input)."""
    import io
    import tarfile

    nets = {}
    with tarfile.open(path, "w") as tar:
        for i, name in enumerate(names):
            net, _, x = official(name, seed=i, num_classes=100)
            optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
            buffer = io.BytesIO()
            torch.save({"epoch": 240, "model": net.state_dict(), "accuracy": torch.tensor(72.34),
                        "optimizer": optimizer.state_dict()}, buffer)
            for member in [f"cifar_teachers/{RELEASE_FOLDERS[name]}/ckpt_epoch_240.pth"]:
                info = tarfile.TarInfo(member)
                info.size = len(buffer.getvalue())
                tar.addfile(info, io.BytesIO(buffer.getvalue()))
            nets[name] = (net, x)
    return nets


@pytest.mark.parametrize("names", [
    ("resnet56", "wrn_40_2"),
    pytest.param(tuple(RELEASE_FOLDERS), marks=pytest.mark.heavy, id="all-six"),  # 12 s on 2 loaded cores
])
def test_cli_converts_every_teacher_of_mdistillers_cifar_teachers_tar(tmp_path, capsys, names):
    nets = write_cifar_teachers_tar(tmp_path / "cifar_teachers.tar", names)
    out = tmp_path / "runs" / "cifar100"
    assert main(["models", "convert", "--from", "mdistiller", str(tmp_path / "cifar_teachers.tar"), str(out)]) == 0
    printed = capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == sorted(f"teacher_{n}" for n in names)
    for name, (net, x) in nets.items():
        assert f"teacher_{name}: {name}, 100 classes" in printed
        model, meta = load_model(out / f"teacher_{name}")  # what the recipes' teacher.checkpoint reads
        assert (meta["model"], meta["num_classes"], meta["converted_from"]) == (name, 100, "mdistiller")
        assert meta["source_file"] == f"cifar_teachers.tar:cifar_teachers/{RELEASE_FOLDERS[name]}/ckpt_epoch_240.pth"
        with torch.no_grad():  # the same tensors: the logits of the official module, to float32 rounding
            torch.testing.assert_close(model.eval()(x), net(x), rtol=1e-5, atol=1e-5)


def test_one_teacher_of_the_tar_and_bad_archives(tmp_path, capsys):
    tar = tmp_path / "cifar_teachers.tar"
    write_cifar_teachers_tar(tar, names=("resnet56",))
    out = tmp_path / "teachers"
    assert main(["models", "convert", "--from", "mdistiller", "--model", "resnet32x4", str(tar), str(out)]) == 2
    assert "holds no teacher resnet32x4; it holds resnet56" in capsys.readouterr().err
    assert main(["models", "convert", "--from", "mdistiller", "--model", "resnet8", str(tar), str(out)]) == 2
    assert "unknown --model (a teacher of cifar_teachers.tar) 'resnet8'" in capsys.readouterr().err
    assert main(["models", "convert", "--from", "timm", str(tar), str(out)]) == 2
    assert "give --from mdistiller" in capsys.readouterr().err
    assert not out.exists()  # nothing written before every check passed
    assert main(["models", "convert", "--from", "mdistiller", "--model", "resnet56", str(tar), str(out)]) == 0
    assert [p.name for p in out.iterdir()] == ["teacher_resnet56"]
    other = tmp_path / "other.tar"
    write_cifar_teachers_tar(other, names=())
    assert main(["models", "convert", "--from", "mdistiller", str(other), str(tmp_path / "o")]) == 2
    assert "holds no teacher of mdistiller's cifar_teachers.tar" in capsys.readouterr().err
    assert main(["models", "convert", "--from", "mdistiller", "--model", "resnet56", str(tmp_path / "x.pth"),
                 str(tmp_path / "x.safetensors")]) == 2


def test_a_pickled_object_in_the_tar_is_refused_unread(tmp_path, capsys):
    import io
    import tarfile

    tar = tmp_path / "cifar_teachers.tar"
    buffer = io.BytesIO()
    torch.save({"model": official("resnet56")[0]}, buffer)  # a whole module: never unpickled
    with tarfile.open(tar, "w") as archive:
        info = tarfile.TarInfo("cifar_teachers/resnet56_vanilla/ckpt_epoch_240.pth")
        info.size = len(buffer.getvalue())
        archive.addfile(info, io.BytesIO(buffer.getvalue()))
    assert main(["models", "convert", "--from", "mdistiller", str(tar), str(tmp_path / "out")]) == 2
    assert "loads with weights_only=True" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
