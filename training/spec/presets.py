"""The built-in model presets: names and shapes, without torch.

The config check (training/spec/config.py) needs them to validate `model.preset` and the
head/width split; it also runs in the Pulumi program, whose venv has no torch.
training/model.py builds the networks from the same table.
"""

from __future__ import annotations

# Shapes of the language-model presets (GPT-2 small/medium, GPT-3 XL and 6.7B, BERT-base
# widths); vocab and seq_len come from the data.
PRESETS: dict[str, dict[str, int]] = {
    "tiny": {"n_layer": 2, "n_head": 2, "n_embd": 64},
    "gpt-124m": {"n_layer": 12, "n_head": 12, "n_embd": 768},
    "gpt-350m": {"n_layer": 24, "n_head": 16, "n_embd": 1024},
    "gpt-1.3b": {"n_layer": 24, "n_head": 16, "n_embd": 2048},
    # GPT-3 6.7B's shape (Brown et al. 2020, table 2.1): the ~7B class.
    "gpt-6.7b": {"n_layer": 32, "n_head": 32, "n_embd": 4096},
    "bert-tiny": {"n_layer": 2, "n_head": 2, "n_embd": 64},
    "bert-base": {"n_layer": 12, "n_head": 12, "n_embd": 768},
}
# Presets with bidirectional attention and a masked-token objective.
ENCODER_PRESETS = frozenset({"bert-tiny", "bert-base"})

# Image classifiers (training/vision.py): ResNets after He et al. 2015, table 1. `blocks`
# per stage; `width` is the first stage's channels (doubled at each later stage).
VISION_PRESETS: dict[str, dict] = {
    "resnet-tiny": {"block": "basic", "blocks": (1, 1), "width": 8},
    "resnet-18": {"block": "basic", "blocks": (2, 2, 2, 2), "width": 64},
    "resnet-50": {"block": "bottleneck", "blocks": (3, 4, 6, 3), "width": 64},
}
