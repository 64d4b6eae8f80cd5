"""The shipped ``faces`` model, TAEF2 and the VAE contract (no ../shared needed)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from facefuse.core.errors import ModelLoadError
from facefuse.models.loading import embedded_model, load_components, resolve_model
from facefuse.models.taef2 import TinyAutoencoderF2, from_published, load_taef2
from facefuse.models.vae import decode_scaled, encode_scaled, load_vae, vae_class_name

FACES = embedded_model("faces")


def _face_crop(size: int = 128) -> np.ndarray:
    """The astronaut's face as the pipeline crops it, float32 [size, size, 3] in [0, 1]."""
    from skimage import data

    from facefuse.face import geometry
    from facefuse.face.detect import find_face
    from facefuse.face.fusion import _crop

    rgb = data.astronaut()
    face = find_face(rgb)
    box = geometry.crop_box(geometry.face_ellipse(face.left_eye, face.right_eye), rgb.shape)
    return _crop(rgb, box, size)


def test_taef2_follows_the_diffusers_vae_interface_with_its_shift():
    torch.manual_seed(0)
    vae = TinyAutoencoderF2(scaling_factor=2.0, shift_factor=0.25).eval()
    image = torch.rand(2, 3, 64, 64) * 2 - 1
    with torch.no_grad():
        latents = vae.encode(image).latents
        assert latents.shape == (2, 32, 8, 8)
        torch.testing.assert_close(latents, vae.raw_encode((image + 1) / 2) - 0.25)
        decoded = vae.decode(latents).sample
        torch.testing.assert_close(decoded, vae.raw_decode(latents + 0.25) * 2 - 1)
        assert decoded.shape == image.shape and decoded.abs().max() <= 1.0
        # the contract multiplies by scaling_factor after encoding and divides before decoding
        torch.testing.assert_close(encode_scaled(vae, image), latents * 2.0)
        torch.testing.assert_close(decode_scaled(vae, latents * 2.0), decoded)


def test_vae_contract_covers_autoencoder_kl(tmp_path):
    from facefuse.models.tiny import TINY, build_vae

    kl = build_vae(TINY)
    kl.save_pretrained(tmp_path / "vae")
    loaded = load_vae(tmp_path / "vae")
    image = torch.rand(1, 3, 64, 64) * 2 - 1
    with torch.no_grad():
        expected = kl.encode(image).latent_dist.mean * kl.config.scaling_factor
        torch.testing.assert_close(encode_scaled(loaded, image), expected)


def test_unsupported_vae_is_refused_naming_the_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"_class_name": "AutoencoderDC"}))
    with pytest.raises(ModelLoadError, match=r"config\.json.*AutoencoderDC.*AutoencoderKL"):
        vae_class_name(tmp_path)
    with pytest.raises(ModelLoadError, match=r"expected a diffusers VAE config\.json"):
        vae_class_name(tmp_path / "missing")


def test_published_weights_of_another_model_are_refused(tmp_path):
    from safetensors.torch import save_file

    with pytest.raises(ModelLoadError, match=r"taef2_encoder\.safetensors"):
        from_published(tmp_path)
    for part in ("encoder", "decoder"):
        save_file({"0.weight": torch.zeros(3)}, tmp_path / f"taef2_{part}.safetensors")
    with pytest.raises(ModelLoadError, match="not TAEF2 weights"):
        from_published(tmp_path)


def test_faces_is_a_complete_small_fp16_diffusers_folder():
    folder = resolve_model("faces")
    assert folder == FACES
    for part in ("unet", "vae", "text_encoder", "tokenizer", "scheduler"):
        assert (folder / part).is_dir(), part
    index = json.loads((folder / "model_index.json").read_text())
    assert index["vae"] == ["facefuse", "TinyAutoencoderF2"]
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    assert size <= 25 * 1024 * 1024
    from safetensors import safe_open

    for weights in folder.rglob("*.safetensors"):
        with safe_open(weights, "pt") as handle:
            key = next(iter(handle.keys()))
            assert handle.get_tensor(key).dtype == torch.float16, weights
    card = (folder / "README.md").read_text()
    assert "CC BY 4.0" in card and "DeBruine" in card
    assert "MIT License" in (folder / "vae" / "LICENSE").read_text()  # TAEF2 travels with it
    heldout = json.loads((folder / "training.json").read_text())["heldout_london_ids"]
    assert len(heldout) >= 15


def test_faces_loads_in_fp32_and_its_vae_reconstructs_a_real_face():
    components = load_components("faces")
    assert components.latent_channels == 32 and components.vae_scale_factor == 8
    assert components.image_size == 128
    assert next(components.unet.parameters()).dtype == torch.float32
    crop = _face_crop(components.image_size)
    image = torch.from_numpy(crop).permute(2, 0, 1)[None] * 2 - 1
    with torch.no_grad():
        latents = encode_scaled(components.vae, image)
        restored = decode_scaled(components.vae, latents)
    # the shift/scale stored in the config bring the latents near unit variance
    assert 0.5 < float(latents.std()) < 2.0 and abs(float(latents.mean())) < 0.5
    mse = float(((restored - image) / 2).pow(2).mean())
    assert 10 * np.log10(1 / mse) > 25.0  # measured about 30 dB; noise would be under 10 dB


def test_load_taef2_reads_a_model_folder_and_refuses_a_kl_one(tmp_path):
    vae = load_taef2(FACES / "vae")
    assert isinstance(vae, TinyAutoencoderF2)
    from facefuse.models.tiny import TINY, build_vae

    build_vae(TINY).save_pretrained(tmp_path / "kl")
    with pytest.raises(ModelLoadError, match="expected a TinyAutoencoderF2 VAE"):
        load_taef2(tmp_path / "kl")
