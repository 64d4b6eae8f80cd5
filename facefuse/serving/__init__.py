"""Serving: the local tritonserver launcher and its arguments, ``facefuse serve``/``demo``,
and the adapters that the Triton ``model.py`` stubs are built on (``triton_io``,
``triton_onnx``, ``triton_pipeline``).

The top layer: it may import every other layer; nothing below imports it.
"""
