"""The seeded tiny model, the real CLIP tokenizer and the ONNX export."""

from __future__ import annotations

import hashlib

import numpy as np
import onnxruntime as ort
import pytest

from facefuse.models.tiny import TINY, build_text_encoder, build_unet
from facefuse.prompt.tokenizer import BOS_ID, EOS_ID, VOCAB_SIZE, build_clip_tokenizer


def _digest(module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


def test_same_seed_same_weights_other_seed_other_weights():
    assert _digest(build_unet(TINY, seed=0)) == _digest(build_unet(TINY, seed=0))
    assert _digest(build_text_encoder(TINY, seed=0)) != _digest(build_text_encoder(TINY, seed=1))


def test_tiny_model_has_sd1_architecture(tiny_components):
    unet = tiny_components.unet.config
    assert "CrossAttnDownBlock2D" in unet.down_block_types
    assert unet.cross_attention_dim == tiny_components.text_encoder.config.hidden_size
    assert unet.in_channels == 4 and tiny_components.vae.config.latent_channels == 4
    assert tiny_components.vae_scale_factor == 8
    assert tiny_components.text_encoder.config.max_position_embeddings == 77


def test_real_clip_tokenizer_ids():
    tokenizer = build_clip_tokenizer()
    assert len(tokenizer) == VOCAB_SIZE
    ids = tokenizer("a photo of an astronaut", padding="max_length", max_length=77)["input_ids"]
    # the ids OpenAI CLIP assigns: a=320, photo=1125, of=539, an=550, astronaut=18376
    assert ids[:7] == [BOS_ID, 320, 1125, 539, 550, 18376, EOS_ID]
    assert ids[7:] == [EOS_ID] * 70 and len(ids) == 77


def test_loading_refuses_a_folder_that_is_not_sd(tmp_path):
    from facefuse.core.errors import ModelLoadError
    from facefuse.models.loading import resolve_model

    with pytest.raises(ModelLoadError, match="unet"):
        resolve_model(tmp_path)


@pytest.mark.parametrize("batch", [1, 3])
def test_exported_unet_has_dynamic_batch_and_matches_torch(tiny_repository, tiny_components, batch):
    import torch

    session = ort.InferenceSession(str(tiny_repository / "unet" / "1" / "model.onnx"))
    rng = np.random.default_rng(batch)
    sample = rng.standard_normal((batch, 4, 32, 32)).astype(np.float32)
    timestep = np.linspace(50, 900, batch).astype(np.float32)
    context = rng.standard_normal((batch, 154, 64)).astype(np.float32)  # 2 chunks of 77
    (onnx_out,) = session.run(
        None, {"sample": sample, "timestep": timestep, "encoder_hidden_states": context}
    )
    with torch.no_grad():
        torch_out = tiny_components.unet(
            torch.from_numpy(sample), torch.from_numpy(timestep), torch.from_numpy(context)
        ).sample.numpy()
    assert onnx_out.shape == (batch, 4, 32, 32)
    assert np.max(np.abs(onnx_out - torch_out)) < 1e-4


def test_export_writes_manifest_and_tokenizer(tiny_repository):
    from facefuse.diffusion.manifest import PipelineManifest

    manifest = PipelineManifest.load(tiny_repository / "facefusion" / "1" / "pipeline.json")
    assert manifest.image_size == 256 and manifest.latent_size == 32 and manifest.text_dim == 64
    assert manifest.pad_token_id == EOS_ID
    assert (tiny_repository / "prompt_optimizer" / "1" / "tokenizer").is_dir()
