"""The ResNet presets: torchvision's layouts, channels-last activations, any precision."""

from __future__ import annotations

import pytest
import torch

from training.vision import build_resnet


@pytest.mark.parametrize(
    ("preset", "parameters"),
    # torchvision's model docs: ResNet18_Weights 11,689,512 and ResNet50_Weights 25,557,032
    # parameters (https://docs.pytorch.org/vision/stable/models.html, 1000 classes).
    [("resnet-18", 11_689_512), ("resnet-50", 25_557_032)],
)
def test_presets_have_torchvisions_parameter_counts(preset, parameters):
    model = build_resnet(preset, num_classes=1000)
    assert sum(p.numel() for p in model.parameters()) == parameters


def test_resnet50_training_flops_are_three_forwards_of_its_published_cost():
    # torchvision's model docs: ResNet50_Weights 4.09 GFLOPS, counted as multiply-adds at
    # 224x224 (2 FLOPs each); He et al. 2015, table 1, give 3.8e9 for the v1 layout.
    model = build_resnet("resnet-50", num_classes=1000)
    assert model.flops_per_token(224) == pytest.approx(3 * 2 * 4.09e9, rel=0.02)


def test_activations_are_channels_last_and_follow_the_weights_dtype():
    model = build_resnet("resnet-tiny", num_classes=3).to(torch.bfloat16)
    seen = []
    model.stem.register_forward_hook(lambda _m, _i, out: seen.append(out))
    logits = model.logits(torch.randn(2, 3, 32, 32))  # fp32 input, as the DataLoader gives
    assert logits.dtype == torch.bfloat16 and logits.shape == (2, 3)
    assert seen[0].is_contiguous(memory_format=torch.channels_last)
    loss = model(torch.randn(2, 3, 32, 32), torch.tensor([0, 2]))
    assert loss.dtype == torch.float32 and loss.ndim == 0


def test_flop_probe_leaves_batchnorm_statistics_alone():
    model = build_resnet("resnet-tiny", num_classes=3)
    before = {name: b.clone() for name, b in model.named_buffers()}
    model.flops_per_token(32)
    assert model.training
    for name, buffer in model.named_buffers():
        assert torch.equal(buffer, before[name]), name
