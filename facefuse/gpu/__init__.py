"""GPU runtime for the Python-backend models: PyTorch FP16 with CUDA graphs (issue 21).

``runtime`` builds the torch modules behind an ONNX-Runtime-like session; ``img2img`` is the
in-process GPU path and the diffusers baseline; ``bench`` extends ``facefuse bench gpu``;
``served`` assembles the torch-cuda model repository and measures it over HTTP.
Nothing here imports torch at module import time.
"""
