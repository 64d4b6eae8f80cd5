"""The DeepCache pair through a real tritonserver: unet_deep's features feed unet_shallow, and
a malformed ``deep`` is refused naming the input while the server keeps serving."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from facefuse.core import contract as c


def _inputs(feeds: dict[str, np.ndarray]) -> list:
    tensors = []
    for name, array in feeds.items():
        tensor = grpcclient.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors


def _call(client, model, feeds, outputs):
    requested = [grpcclient.InferRequestedOutput(name) for name in outputs]
    result = client.infer(model.name, _inputs(feeds), outputs=requested)
    return [result.as_numpy(name) for name in outputs]


def test_shallow_on_deep_features_answers_and_bad_deep_is_invalid_argument(server, tiny_components):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    latent_channels = tiny_components.unet.config.in_channels
    text_dim = tiny_components.text_encoder.config.hidden_size
    rng = np.random.default_rng(0)
    feeds = {
        c.SAMPLE.name: rng.standard_normal((2, latent_channels, 16, 16)).astype(np.float32),
        c.TIMESTEP.name: np.array([[500.0], [20.0]], np.float32),
        c.ENCODER_HIDDEN_STATES.name: rng.standard_normal((2, 77, text_dim)).astype(np.float32),
    }
    noise, deep = _call(client, c.UNET_DEEP, feeds, c.UNET_DEEP.output_names)
    deep_channels = deep.shape[1]
    assert deep.shape == (2, deep_channels, 16, 16) and noise.shape == feeds[c.SAMPLE.name].shape
    (shallow,) = _call(client, c.UNET_SHALLOW, {**feeds, c.DEEP.name: deep}, ("noise_pred",))
    # the same step: shallow on its own step's features answers what the whole UNet did (up to
    # the INT8 graphs' activation quantisation)
    assert np.all(np.isfinite(shallow))
    assert np.abs(shallow - noise).max() <= 0.1 * max(1.0, float(np.abs(noise).max()))
    bad = np.zeros((2, deep_channels + 1, 16, 16), np.float32)
    with pytest.raises(InferenceServerException) as error:
        _call(client, c.UNET_SHALLOW, {**feeds, c.DEEP.name: bad}, ("noise_pred",))
    assert "deep" in str(error.value) and "INVALID_ARG" in str(error.value.status())
    (again,) = _call(client, c.UNET_SHALLOW, {**feeds, c.DEEP.name: deep}, ("noise_pred",))
    np.testing.assert_array_equal(again, shallow)  # still serving, same answer
