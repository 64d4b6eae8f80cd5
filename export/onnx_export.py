"""ONNX export of the SD 1.x components, each checked against PyTorch on the same input.

Every graph has a dynamic batch axis. Files larger than 2 GB are written with ONNX external
data (``<name>.onnx.data`` beside the graph), so real SD 1.5 UNets export too.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Bound on |ONNX - PyTorch| for fp32 graphs on the check input; relative to the output scale.
PARITY_TOLERANCE = 1e-3


@dataclass
class ExportResult:
    """One exported graph and its parity check against PyTorch."""

    name: str
    path: Path
    max_abs_diff: float
    output_scale: float
    tolerance: float | None = None  # an absolute bound; None: PARITY_TOLERANCE x output scale

    @property
    def ok(self) -> bool:
        if self.tolerance is not None:
            return self.max_abs_diff <= self.tolerance
        return self.max_abs_diff <= PARITY_TOLERANCE * max(1.0, self.output_scale)


def _wrappers():
    import torch

    from facefuse.models.vae import decode_scaled, encode_scaled

    class TextEncoder(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids):
            out = self.model(input_ids=input_ids, return_dict=True)
            return out.last_hidden_state, out.pooler_output

    class Unet(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, sample, timestep, encoder_hidden_states):
            return self.model(sample, timestep, encoder_hidden_states, return_dict=False)[0]

    class VaeEncoder(torch.nn.Module):
        """Pixels in [-1, 1] -> scaled latents (deterministic img2img encoding)."""

        def __init__(self, vae):
            super().__init__()
            self.vae = vae

        def forward(self, image):
            return encode_scaled(self.vae, image)

    class VaeDecoder(torch.nn.Module):
        """Scaled latents -> pixels in [-1, 1]."""

        def __init__(self, vae):
            super().__init__()
            self.vae = vae

        def forward(self, latents):
            return decode_scaled(self.vae, latents)

    return TextEncoder, Unet, VaeEncoder, VaeDecoder


def _export(module, args, path: Path, input_names, output_names, dynamic_axes) -> None:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about Python control flow are expected
        torch.onnx.export(
            module,
            args,
            str(path),
            input_names=input_names,
            output_names=output_names,
            dynamic_axes=dynamic_axes,
            opset_version=17,
            dynamo=False,
        )
    _externalize_if_large(path)


def _externalize_if_large(path: Path) -> None:
    """Move weights to ``<file>.data`` when the graph is near the 2 GB protobuf limit."""
    import onnx
    from facefuse.export.quantize import EXTERNAL_DATA_LIMIT, save_model

    if path.stat().st_size < EXTERNAL_DATA_LIMIT:
        return
    save_model(onnx.load(str(path), load_external_data=True), path, large=True)


def _parity(name: str, path: Path, feeds: dict, reference: list[np.ndarray]) -> ExportResult:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    outputs = session.run(None, feeds)
    diff = max(float(np.max(np.abs(o - r))) for o, r in zip(outputs, reference))
    scale = max(float(np.max(np.abs(r))) for r in reference)
    return ExportResult(name, path, diff, scale)


def export_text_encoder(text_encoder, path: Path, batch: int = 2) -> ExportResult:
    import torch

    text_wrapper = _wrappers()[0]
    module = text_wrapper(text_encoder).eval()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 49406, (batch, 77), generator=generator)
    ids[:, 0] = 49406
    ids[:, 20:] = 49407
    _export(
        module,
        (ids,),
        path,
        ["input_ids"],
        ["last_hidden_state", "pooled"],
        {"input_ids": {0: "batch"}, "last_hidden_state": {0: "batch"}, "pooled": {0: "batch"}},
    )
    with torch.no_grad():
        reference = [t.numpy() for t in module(ids)]
    return _parity("text_encoder", path, {"input_ids": ids.numpy()}, reference)


def _unet_check_inputs(unet, latent_size: int, text_dim: int, batch: int):
    """The seeded (sample, timestep, context) that UNet-family graphs are traced and checked on."""
    import torch

    generator = torch.Generator().manual_seed(0)
    channels = unet.config.in_channels
    sample = torch.randn(batch, channels, latent_size, latent_size, generator=generator)
    timestep = torch.tensor([999.0, 500.0][:batch] + [10.0] * max(0, batch - 2))
    context = torch.randn(batch, 77, text_dim, generator=generator)
    return sample, timestep, context


def export_unet(unet, path: Path, latent_size: int, text_dim: int, batch: int = 2) -> ExportResult:
    import torch

    module = _wrappers()[1](unet).eval()
    sample, timestep, context = _unet_check_inputs(unet, latent_size, text_dim, batch)
    _export(
        module,
        (sample, timestep, context),
        path,
        ["sample", "timestep", "encoder_hidden_states"],
        ["noise_pred"],
        {
            "sample": {0: "batch", 2: "height", 3: "width"},
            "timestep": {0: "batch"},
            "encoder_hidden_states": {0: "batch", 1: "sequence"},
            "noise_pred": {0: "batch", 2: "height", 3: "width"},
        },
    )
    with torch.no_grad():
        reference = [module(sample, timestep, context).numpy()]
    feeds = {
        "sample": sample.numpy(),
        "timestep": timestep.numpy(),
        "encoder_hidden_states": context.numpy(),
    }
    return _parity("unet", path, feeds, reference)


def export_vae_encoder(vae, path: Path, image_size: int, batch: int = 1) -> ExportResult:
    import torch

    module = _wrappers()[2](vae).eval()
    image = torch.rand(batch, 3, image_size, image_size, generator=torch.Generator().manual_seed(0))
    image = image * 2 - 1
    _export(
        module,
        (image,),
        path,
        ["image"],
        ["latent"],
        {"image": {0: "batch", 2: "height", 3: "width"}, "latent": {0: "batch", 2: "h", 3: "w"}},
    )
    with torch.no_grad():
        reference = [module(image).numpy()]
    return _parity("vae_encoder", path, {"image": image.numpy()}, reference)


def export_vae_decoder(vae, path: Path, latent_size: int, batch: int = 1) -> ExportResult:
    import torch

    module = _wrappers()[3](vae).eval()
    from facefuse.models.vae import latent_channels

    shape = (batch, latent_channels(vae), latent_size, latent_size)
    latents = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    _export(
        module,
        (latents,),
        path,
        ["latent"],
        ["image"],
        {"latent": {0: "batch", 2: "h", 3: "w"}, "image": {0: "batch", 2: "height", 3: "width"}},
    )
    with torch.no_grad():
        reference = [module(latents).numpy()]
    return _parity("vae_decoder", path, {"latent": latents.numpy()}, reference)


def export_unet_deep_cache(
    unet, deep_path: Path, shallow_path: Path, latent_size: int, text_dim: int, batch: int = 2
) -> list[ExportResult]:
    """The DeepCache pair (:mod:`facefuse.models.deepcache`), each checked against the plain
    UNet's forward on the same input: ``unet_deep`` returns it and ``deep``; ``unet_shallow``
    on that ``deep`` returns it again (exact at an unchanged step)."""
    import torch

    from facefuse.models.deepcache import DeepUnet, ShallowUnet

    deep_module, shallow_module = DeepUnet(unet).eval(), ShallowUnet(unet).eval()
    sample, timestep, context = _unet_check_inputs(unet, latent_size, text_dim, batch)
    spatial = {0: "batch", 2: "height", 3: "width"}
    common = {"timestep": {0: "batch"}, "encoder_hidden_states": {0: "batch", 1: "sequence"}}
    names = ["sample", "timestep", "encoder_hidden_states"]
    with torch.no_grad():
        reference = unet(sample, timestep, context, return_dict=False)[0].numpy()
        _, deep = deep_module(sample, timestep, context)
    _export(
        deep_module,
        (sample, timestep, context),
        deep_path,
        names,
        ["noise_pred", "deep"],
        {"sample": spatial, **common, "noise_pred": spatial, "deep": spatial},
    )
    _export(
        shallow_module,
        (sample, timestep, context, deep),
        shallow_path,
        [*names, "deep"],
        ["noise_pred"],
        {"sample": spatial, **common, "deep": spatial, "noise_pred": spatial},
    )
    feeds = {"sample": sample.numpy(), "timestep": timestep.numpy()}
    feeds["encoder_hidden_states"] = context.numpy()
    checks = [_parity("unet_deep", deep_path, feeds, [reference, deep.numpy()])]
    checks.append(
        _parity("unet_shallow", shallow_path, {**feeds, "deep": deep.numpy()}, [reference])
    )
    return checks
