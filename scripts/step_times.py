"""CPU time of one training step of the image protocols' networks (docs/results.md, "What cannot run here").

Times forward + backward + SGD step, median of ``--repeats`` steps after one warm-up step, with the
process's default torch thread count:

* ``resnet18_cifar(100)`` on a batch of 128 random 3×32×32 images (difftopk's CIFAR-100 protocol);
* ``PreActResNet18(in_channels=1)`` and ``ConvNet`` on 200 random 1×28×28 images (one differentiable
  kNN step: 100 queries + 100 candidates).

Run: ``python scripts/step_times.py`` (about a minute on 2 CPU cores; needs the ``lab`` extra).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from softtopk_lab.models import ConvNet, PreActResNet18, resnet18_cifar


def step_seconds(model: torch.nn.Module, images: torch.Tensor, repeats: int) -> float:
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        loss = model(images).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per network (default 5)")
    repeats = parser.parse_args().repeats
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; median of {repeats} steps")
    cases = [
        ("resnet18_cifar(100), batch 128 x 3x32x32", resnet18_cifar(100), torch.randn(128, 3, 32, 32)),
        ("PreActResNet18, 200 x 1x28x28", PreActResNet18(in_channels=1), torch.randn(200, 1, 28, 28)),
        ("ConvNet, 200 x 1x28x28", ConvNet(), torch.randn(200, 1, 28, 28)),
    ]
    for name, model, images in cases:
        print(f"  {name:<42} {step_seconds(model, images, repeats):8.3f} s/step")


if __name__ == "__main__":
    main()
