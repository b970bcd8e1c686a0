"""Drop-in attention modules built on attn2d's fused kernels."""

from .multihead_self_attention2d import MultiheadSelfAttention2d
from .self_attention2d import SelfAttention2d
from .vit import Attention, CrossAttention

__all__ = ["Attention", "CrossAttention", "MultiheadSelfAttention2d", "SelfAttention2d"]
