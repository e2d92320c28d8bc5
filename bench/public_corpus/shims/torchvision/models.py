"""torchvision.models for the corpus shim: a ResNet-18-shaped network (64..512 channels) under the resnet names (random
initialisation: pretrained weights cannot be downloaded here), with torchvision's attribute names
(conv1, bn1, layer1..4, avgpool, fc) so scripts that replace `fc` or read `fc.in_features` work; and VGG-16/19
with torchvision's layer layout (features, avgpool, classifier), for scripts that slice `features` as a
perceptual loss."""

import torch.nn as nn


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + identity)


class ResNet(nn.Module):
    def __init__(self, layers=(2, 2, 2, 2), num_classes=1000, width=64):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        planes, stages = width, []
        for i, count in enumerate(layers):
            out = width * 2 ** i
            blocks = [BasicBlock(planes, out, 1 if i == 0 else 2)] + [BasicBlock(out, out) for _ in range(count - 1)]
            stages.append(nn.Sequential(*blocks))
            planes = out
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(planes, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.avgpool(x).flatten(1))


def _resnet(layers):
    def build(pretrained=False, weights=None, progress=True, num_classes=1000, **_):
        return ResNet(layers, num_classes)
    return build


resnet18 = _resnet((2, 2, 2, 2))
resnet34 = resnet50 = resnet101 = resnet152 = _resnet((1, 1, 1, 1))
model_names = ["resnet18", "resnet34", "resnet50", "resnet101", "resnet152"]


VGG_LAYERS = {16: (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"),
              19: (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M")}


class VGG(nn.Module):
    def __init__(self, depth, num_classes=1000):
        super().__init__()
        layers, channels = [], 3
        for width in VGG_LAYERS[depth]:
            if width == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(channels, width, 3, padding=1), nn.ReLU(inplace=True)]
                channels = width
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(nn.Linear(512 * 7 * 7, 4096), nn.ReLU(True), nn.Dropout(), nn.Linear(4096, 4096),
                                        nn.ReLU(True), nn.Dropout(), nn.Linear(4096, num_classes))

    def forward(self, x):
        return self.classifier(self.avgpool(self.features(x)).flatten(1))


def _vgg(depth):
    def build(pretrained=False, weights=None, progress=True, num_classes=1000, **_):
        return VGG(depth, num_classes)
    return build


vgg16, vgg19 = _vgg(16), _vgg(19)


class ResNet18_Weights:  # noqa: N801
    DEFAULT = IMAGENET1K_V1 = None
