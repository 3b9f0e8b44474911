"""Image networks for the reproduction experiments, written from the papers' descriptions.

* :func:`resnet18_cifar`: the CIFAR-100 classifier of difftopk's ``train_cifar100.py`` (Petersen et al.,
  2022): a BasicBlock ResNet-18 (He et al., 2016) whose stem is a 3×3 stride-1 convolution, with the
  stem's 3×3 stride-2 max-pool **kept**, and a 512→``num_classes`` linear head.
* :class:`PreActResNet18`: the pre-activation ResNet-18 (He et al., 2016, "Identity mappings") used as the
  Fashion-MNIST / CIFAR-10 embedding network of the differentiable kNN experiments (Grover et al., 2019;
  Xie & Ermon, 2019), without the final linear layer: a 512-d embedding.
* :class:`ConvNet`: the MNIST embedding network of the same experiments (conv 20@5×5, pool, conv 50@5×5,
  pool, linear 800→500, ReLU): a 500-d embedding.

Parameter counts (computed with ``sum(p.numel() for p in model.parameters())``):

=======================================  ===========
``resnet18_cifar(100)``                  11,220,132
``resnet18_cifar(10)``                   11,173,962
``PreActResNet18(in_channels=3)``        11,166,016
``PreActResNet18(in_channels=1)``        11,164,864
``ConvNet()``                               426,070
=======================================  ===========

References:
    K. He, X. Zhang, S. Ren, J. Sun. Deep residual learning for image recognition. CVPR 2016.
    K. He, X. Zhang, S. Ren, J. Sun. Identity mappings in deep residual networks. ECCV 2016.
    A. Grover, E. Wang, A. Zweig, S. Ermon. Stochastic optimization of sorting networks via continuous
    relaxations. ICLR 2019.
    S. M. Xie, S. Ermon. Reparameterizable subset sampling via continuous relaxations. IJCAI 2019.
    F. Petersen, H. Kuehne, C. Borgelt, O. Deussen. Differentiable top-k classification learning. ICML 2022.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["BasicBlock", "ConvNet", "PreActBlock", "PreActResNet18", "ResNet18", "resnet18_cifar"]


def _conv3x3(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=stride, padding=1, bias=False)


def _check_positive_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


class BasicBlock(nn.Module):
    """Post-activation residual block of ResNet-18/34 (He et al., 2016).

    ``relu(bn(conv3x3(relu(bn(conv3x3(x))))) + shortcut(x))`` where the shortcut is the identity, or a
    1×1 strided convolution + BatchNorm when the stride or the width changes.

    Args:
        in_channels: input channels.
        out_channels: output channels.
        stride: stride of the first convolution (2 halves the spatial size).

    Shape:
        - Input: ``(N, in_channels, H, W)``.
        - Output: ``(N, out_channels, ceil(H / stride), ceil(W / stride))``.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = _conv3x3(in_channels, out_channels, stride)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = _conv3x3(out_channels, out_channels)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        if stride != 1 or in_channels != out_channels:
            self.downsample: nn.Module = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )
        else:
            self.downsample = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.downsample(x))


class ResNet18(nn.Module):
    """ResNet-18 with a CIFAR stem, as difftopk trains it on CIFAR-100 (He et al., 2016; Petersen et al., 2022).

    Stem: 3×3 stride-1 convolution (64 channels), BatchNorm, ReLU, then the ImageNet ResNet's 3×3 stride-2
    max-pool, which difftopk keeps (so a 32×32 image enters the first stage at 16×16). Four stages of two
    :class:`BasicBlock` each, widths 64/128/256/512, strides 1/2/2/2; global average pooling; linear head
    512 → ``num_classes``. Weights use PyTorch's default initialisation.

    Args:
        num_classes: number of output logits (100 for CIFAR-100).
        in_channels: image channels (3 for CIFAR).

    Shape:
        - Input: ``(N, in_channels, H, W)`` float, normalised (see
          :func:`softtopk_lab.cifar_data.normalize_cifar`); any ``H, W ≥ 1``, 32×32 for CIFAR.
        - Output: ``(N, num_classes)`` logits.
    """

    def __init__(self, num_classes: int = 100, in_channels: int = 3) -> None:
        super().__init__()
        _check_positive_int("num_classes", num_classes)
        _check_positive_int("in_channels", in_channels)
        self.num_classes = num_classes
        self.in_channels = in_channels
        self.conv1 = _conv3x3(in_channels, 64)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        widths, strides, layers, channels = (64, 128, 256, 512), (1, 2, 2, 2), [], 64
        for width, stride in zip(widths, strides, strict=True):
            layers.append(nn.Sequential(BasicBlock(channels, width, stride), BasicBlock(width, width)))
            channels = width
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))

    def extra_repr(self) -> str:
        return f"num_classes={self.num_classes}, in_channels={self.in_channels}"


def resnet18_cifar(num_classes: int = 100) -> ResNet18:
    """The difftopk CIFAR-100 ResNet-18: 3×3 stride-1 stem, max-pool kept, linear head 512 → ``num_classes``.

    Args:
        num_classes: number of classes (default 100).

    Returns:
        A freshly initialised :class:`ResNet18` (11,220,132 parameters for 100 classes).

    Shape:
        - Input: ``(N, 3, 32, 32)`` normalised images.
        - Output: ``(N, num_classes)`` logits.

    References:
        He et al., Deep residual learning for image recognition, CVPR 2016; Petersen et al.,
        Differentiable top-k classification learning, ICML 2022 (``experiments/train_cifar100.py``).
    """
    return ResNet18(num_classes=num_classes, in_channels=3)


class PreActBlock(nn.Module):
    """Pre-activation residual block (He et al., 2016, "Identity mappings in deep residual networks").

    ``conv3x3(relu(bn(conv3x3(relu(bn(x)))))) + shortcut``; the shortcut is ``x``, or, when the stride or the
    width changes, a 1×1 strided convolution applied to ``relu(bn(x))``.

    Args:
        in_channels: input channels.
        out_channels: output channels.
        stride: stride of the first convolution.

    Shape:
        - Input: ``(N, in_channels, H, W)``.
        - Output: ``(N, out_channels, ceil(H / stride), ceil(W / stride))``.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_channels)
        self.conv1 = _conv3x3(in_channels, out_channels, stride)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.conv2 = _conv3x3(out_channels, out_channels)
        self.relu = nn.ReLU()
        self.shortcut = (
            nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=stride, bias=False)
            if stride != 1 or in_channels != out_channels
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = self.relu(self.bn1(x))
        shortcut = x if self.shortcut is None else self.shortcut(pre)
        out = self.conv1(pre)
        out = self.conv2(self.relu(self.bn2(out)))
        return out + shortcut


class PreActResNet18(nn.Module):
    """Pre-activation ResNet-18 embedding network, without the final linear layer (512-d output).

    The Fashion-MNIST / CIFAR-10 network of the differentiable kNN experiments (Grover et al., 2019;
    Xie & Ermon, 2019): a 3×3 stride-1 stem convolution (64 channels, no max-pool), four stages of two
    :class:`PreActBlock` each (widths 64/128/256/512, strides 1/2/2/2), then global average pooling. As in
    the widely used CIFAR implementation these papers build on, there is no BatchNorm/ReLU after the last
    block. 28×28 inputs end at 4×4 before pooling, 32×32 inputs at 4×4 as well.

    Args:
        in_channels: image channels: 1 for Fashion-MNIST, 3 for CIFAR-10.

    Shape:
        - Input: ``(N, in_channels, H, W)`` float.
        - Output: ``(N, 512)`` embedding.

    Parameters: 11,166,016 for ``in_channels=3``, 11,164,864 for ``in_channels=1``.

    References:
        He et al., Identity mappings in deep residual networks, ECCV 2016; Grover et al., Stochastic
        optimization of sorting networks via continuous relaxations, ICLR 2019; Xie & Ermon,
        Reparameterizable subset sampling via continuous relaxations, IJCAI 2019.
    """

    embedding_dim = 512

    def __init__(self, in_channels: int = 3) -> None:
        super().__init__()
        _check_positive_int("in_channels", in_channels)
        self.in_channels = in_channels
        self.conv1 = _conv3x3(in_channels, 64)
        widths, strides, layers, channels = (64, 128, 256, 512), (1, 2, 2, 2), [], 64
        for width, stride in zip(widths, strides, strict=True):
            layers.append(nn.Sequential(PreActBlock(channels, width, stride), PreActBlock(width, width)))
            channels = width
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return torch.flatten(self.avgpool(x), 1)

    def extra_repr(self) -> str:
        return f"in_channels={self.in_channels}, embedding_dim={self.embedding_dim}"


class ConvNet(nn.Module):
    """MNIST kNN embedding network (Grover et al., 2019; Xie & Ermon, 2019): a 500-d embedding.

    ``conv 20@5×5 → ReLU → max-pool 2 → conv 50@5×5 → ReLU → max-pool 2 → linear 800→500 → ReLU``
    (28 → 24 → 12 → 8 → 4, and 50·4·4 = 800). The papers list the layers only; the ReLUs after the two
    convolutions follow the classic LeNet-style MNIST network they describe.

    Shape:
        - Input: ``(N, 1, 28, 28)`` float.
        - Output: ``(N, 500)`` non-negative embedding.

    Parameters: 426,070.

    References:
        Grover et al., Stochastic optimization of sorting networks via continuous relaxations, ICLR 2019;
        Xie & Ermon, Reparameterizable subset sampling via continuous relaxations, IJCAI 2019.
    """

    embedding_dim = 500

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 20, kernel_size=5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(20, 50, kernel_size=5),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.fc = nn.Linear(800, 500)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-3:] != (1, 28, 28):
            raise ValueError(f"ConvNet expects input of shape (N, 1, 28, 28), got {tuple(x.shape)}")
        return self.relu(self.fc(torch.flatten(self.features(x), 1)))
