"""ViT-B/16 (Dosovitskiy et al. 2021) from torch's own modules (``nn.TransformerEncoderLayer``, whose
``nn.MultiheadAttention`` packs q, k and v in one projection as torchvision's does): 86,567,656 parameters
at 224x224 pixels and 1,000 classes, torchvision's ``vit_b_16`` exactly (tested).

Its gradients are ~150 tensors of a few near-equal sizes (each block's 768x2304 attention projection,
768x768 output, 768x3072 and 3072x768 MLP weights), so equal-byte shards over S servers fall on tensor
boundaries almost evenly, unlike ResNet-50's few large convolutions.
"""
from __future__ import annotations

import torch
from torch import nn

PATCH, DIM, DEPTH, HEADS, MLP = 16, 768, 12, 12, 3072


class ViT(nn.Module):
    """Patches of ``patch`` pixels embedded by a strided convolution, a class token, learned position
    embeddings (one per patch of an ``image_size`` input, which must be a multiple of ``patch``), ``depth``
    pre-norm encoder layers, and a linear head on the class token."""

    def __init__(self, image_size: int = 224, num_classes: int = 1000, patch: int = PATCH, dim: int = DIM,
                 depth: int = DEPTH, heads: int = HEADS, mlp: int = MLP):
        super().__init__()
        if image_size % patch:
            raise ValueError(f"ViT needs an image size that is a multiple of its patch {patch}, got {image_size}")
        self.patch = patch
        self.conv_proj = nn.Conv2d(3, dim, patch, patch)
        self.class_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embedding = nn.Parameter(torch.empty(1, (image_size // patch) ** 2 + 1, dim).normal_(std=0.02))
        layer = nn.TransformerEncoderLayer(dim, heads, mlp, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True, layer_norm_eps=1e-6)
        self.encoder = nn.TransformerEncoder(layer, depth, norm=nn.LayerNorm(dim, eps=1e-6),
                                             enable_nested_tensor=False)
        for block in self.encoder.layers:  # the encoder cloned one layer: each draws weights of its own
            block.self_attn._reset_parameters()
            for m in (block.linear1, block.linear2):
                m.reset_parameters()
        self.head = nn.Linear(dim, num_classes)
        nn.init.zeros_(self.head.weight)  # torchvision's: a zero head, trained from the first step
        nn.init.zeros_(self.head.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_proj(x).flatten(2).transpose(1, 2)  # B x patches x dim
        x = torch.cat([self.class_token.expand(len(x), -1, -1), x], dim=1) + self.pos_embedding
        return self.head(self.encoder(x)[:, 0])
