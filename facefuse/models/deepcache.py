"""DeepCache (Ma et al. 2024) for SD 1.x UNets: reuse the deep features between steps.

A UNet's deep layers change slowly from one denoising step to the next, its shallowest ones do
not. The shallowest skip connection joins ``conv_in``'s output to the last layer of the last up
block; everything else feeds that layer through ``deep``, its other input. :class:`DeepUnet`
is the whole UNet that also returns ``deep``; :class:`ShallowUnet` takes a ``deep`` from an
earlier step and runs only ``conv_in``, that last layer (resnet and, when the block has them,
attention) and ``conv_out``. The loop (:func:`facefuse.diffusion.loop.denoise`) calls the deep
graph every N steps and the shallow one between (DeepCache's uniform schedule, branch 0).

Invariants: ``DeepUnet(x, t, c)[0]`` equals the UNet's own forward; ``ShallowUnet(x, t, c,
DeepUnet(x, t, c)[1])`` equals it too (the cache is exact when the step does not change).
Only SD 1.x-style UNets are accepted (no class, addition or hint embeddings, no FreeU).
"""

from __future__ import annotations

import torch

UNSUPPORTED = ("class_embed_type", "addition_embed_type", "encoder_hid_dim_type")


def check_supported(unet) -> None:
    """Raise ValueError naming the config field of a UNet this split does not cover."""
    config = unet.config
    for key in UNSUPPORTED:
        if getattr(config, key, None) is not None:
            raise ValueError(f"DeepCache supports SD 1.x UNets only: unet config {key} is set")
    if config.center_input_sample or len(unet.up_blocks) < 2:
        raise ValueError("DeepCache supports SD 1.x UNets only (2+ levels, no input centring)")
    if getattr(unet.up_blocks[-1], "upsamplers", None) is not None:
        raise ValueError("DeepCache: the UNet's last up block must not upsample")


def _embedding(unet, sample: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor:
    emb = unet.time_embedding(unet.get_time_embed(sample=sample, timestep=timestep), None)
    return unet.time_embed_act(emb) if unet.time_embed_act is not None else emb


def _block(block, hidden, emb, context, **kwargs):
    if getattr(block, "has_cross_attention", False):
        return block(hidden_states=hidden, temb=emb, encoder_hidden_states=context, **kwargs)
    return block(hidden_states=hidden, temb=emb, **kwargs)


def _output(unet, hidden: torch.Tensor) -> torch.Tensor:
    if unet.conv_norm_out is not None:
        hidden = unet.conv_act(unet.conv_norm_out(hidden))
    return unet.conv_out(hidden)


def _up_layer(block, index: int, hidden, skip, emb, context):
    """Layer ``index`` of an up block, as the block's own forward runs it (FreeU off)."""
    hidden = block.resnets[index](torch.cat([hidden, skip], dim=1), emb)
    if getattr(block, "attentions", None) is not None:
        hidden = block.attentions[index](hidden, encoder_hidden_states=context, return_dict=False)[
            0
        ]
    return hidden


class DeepUnet(torch.nn.Module):
    """``(sample, timestep, context) -> (noise_pred, deep)``: the UNet, also returning ``deep``."""

    def __init__(self, unet):
        super().__init__()
        check_supported(unet)
        self.unet = unet

    def forward(self, sample, timestep, encoder_hidden_states):
        u, context = self.unet, encoder_hidden_states
        emb = _embedding(u, sample, timestep)
        hidden = u.conv_in(sample)
        skips = (hidden,)
        for block in u.down_blocks:
            hidden, res = _block(block, hidden, emb, context)
            skips += res
        if u.mid_block is not None:
            if getattr(u.mid_block, "has_cross_attention", False):
                hidden = u.mid_block(hidden, emb, encoder_hidden_states=context)
            else:
                hidden = u.mid_block(hidden, emb)
        for block in u.up_blocks[:-1]:
            n = len(block.resnets)
            res, skips = skips[-n:], skips[:-n]
            hidden = _block(block, hidden, emb, context, res_hidden_states_tuple=res)
        last = u.up_blocks[-1]  # its skips, last first: ... , conv_in's output
        for index in range(len(last.resnets) - 1):
            hidden = _up_layer(last, index, hidden, skips[-1 - index], emb, context)
        deep = hidden
        hidden = _up_layer(last, len(last.resnets) - 1, deep, skips[0], emb, context)
        return _output(u, hidden), deep


class ShallowUnet(torch.nn.Module):
    """``(sample, timestep, context, deep) -> noise_pred``: ``conv_in``, the last up layer on a
    cached ``deep``, ``conv_out``."""

    def __init__(self, unet):
        super().__init__()
        check_supported(unet)
        self.unet = unet

    def forward(self, sample, timestep, encoder_hidden_states, deep):
        u = self.unet
        emb = _embedding(u, sample, timestep)
        last = u.up_blocks[-1]
        hidden = _up_layer(
            last, len(last.resnets) - 1, deep, u.conv_in(sample), emb, encoder_hidden_states
        )
        return _output(u, hidden)
