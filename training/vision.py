"""ResNet image classifiers (He et al. 2015, "Deep Residual Learning for Image Recognition"),
in plain PyTorch modules, with the trainer's model interface.

`forward(images, labels)` returns the cross-entropy loss; `logits(images)` the class scores,
`score(images, labels)` a held-out batch's summed loss and correct predictions
(the held-out evaluation uses them). Activations run channels-last (NHWC), the layout
tensor cores convolve fastest in half precision (the input is made channels-last; see
build_resnet for the weights); the input is also cast to the weights' dtype,
so the same model trains in fp32, bf16 and fp16 (DeepSpeed casts the weights).

The layout matches torchvision's resnet18/resnet50 (stride on the 3x3 convolution of a
bottleneck, "ResNet v1.5"), so the parameter counts agree: 11.7M and 25.6M at 1000 classes.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode

from training.spec.presets import VISION_PRESETS


def _conv_bn(c_in: int, c_out: int, kernel: int, stride: int = 1) -> list[nn.Module]:
    return [
        nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=kernel // 2, bias=False),
        nn.BatchNorm2d(c_out),
    ]


class BasicBlock(nn.Module):
    """Two 3x3 convolutions (ResNet-18/34)."""

    expansion = 1

    def __init__(self, c_in: int, width: int, stride: int):
        super().__init__()
        c_out = width * self.expansion
        self.body = nn.Sequential(
            *_conv_bn(c_in, width, 3, stride), nn.ReLU(inplace=True), *_conv_bn(width, c_out, 3)
        )
        self.shortcut = _shortcut(c_in, c_out, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.shortcut(x))


class Bottleneck(nn.Module):
    """1x1 down, 3x3 (strided), 1x1 up by 4 (ResNet-50 and deeper)."""

    expansion = 4

    def __init__(self, c_in: int, width: int, stride: int):
        super().__init__()
        c_out = width * self.expansion
        self.body = nn.Sequential(
            *_conv_bn(c_in, width, 1),
            nn.ReLU(inplace=True),
            *_conv_bn(width, width, 3, stride),
            nn.ReLU(inplace=True),
            *_conv_bn(width, c_out, 1),
        )
        self.shortcut = _shortcut(c_in, c_out, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.shortcut(x))


def _shortcut(c_in: int, c_out: int, stride: int) -> nn.Module:
    if stride == 1 and c_in == c_out:
        return nn.Identity()
    return nn.Sequential(*_conv_bn(c_in, c_out, 1, stride))


class ResNet(nn.Module):
    def __init__(self, *, block: str, blocks: tuple[int, ...], width: int, num_classes: int):
        super().__init__()
        kind = {"basic": BasicBlock, "bottleneck": Bottleneck}[block]
        self.stem = nn.Sequential(
            *_conv_bn(3, width, 7, stride=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        stages, c_in = [], width
        for index, count in enumerate(blocks):
            stage_width = width * 2**index
            for position in range(count):
                stride = 2 if index > 0 and position == 0 else 1
                stages.append(kind(c_in, stage_width, stride))
                c_in = stage_width * kind.expansion
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(c_in, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
        # Each residual branch starts as the identity (Goyal et al. 2017, section 5.1).
        for module in self.modules():
            if isinstance(module, BasicBlock | Bottleneck):
                nn.init.zeros_(module.body[-1].weight)
        self._flops_per_image: dict[int, int] = {}

    def logits(self, images: torch.Tensor) -> torch.Tensor:
        first = self.stem[0].weight
        x = images.to(dtype=first.dtype, memory_format=torch.channels_last)
        x = self.stages(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.logits(images).float(), labels)

    def score(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """[summed loss, correct top-1, images] of a held-out batch (training/evaluation.py)."""
        logits = self.logits(images).float()
        loss = F.cross_entropy(logits, labels, reduction="sum")
        correct = (logits.argmax(dim=1) == labels).sum().to(loss.dtype)
        return torch.stack([loss, correct, torch.tensor(float(len(labels)), device=loss.device)])

    def flops_per_token(self, image_size: int) -> int:
        """Training FLOPs per image (an image is this model's token): 3x the forward's
        (the backward costs about twice the forward), counted by PyTorch's FLOP counter."""
        if image_size not in self._flops_per_image:
            was_training = self.training
            self.eval()  # no BatchNorm statistics from the probe
            counter = FlopCounterMode(display=False)
            with torch.no_grad(), counter:
                self.logits(torch.zeros(1, 3, image_size, image_size))
            self.train(was_training)
            self._flops_per_image[image_size] = 3 * counter.get_total_flops()
        return self._flops_per_image[image_size]


def build_resnet(preset: str, *, num_classes: int) -> ResNet:
    """A ResNet preset (training/spec/presets.py).

    The weights stay in PyTorch's default layout: DeepSpeed broadcasts each parameter as a
    flat byte view and ZeRO packs them into flat buffers, both of which need it. cuDNN
    convolves in NHWC when the input is channels-last, whatever the weight's layout.
    """
    return ResNet(**VISION_PRESETS[preset], num_classes=num_classes)
