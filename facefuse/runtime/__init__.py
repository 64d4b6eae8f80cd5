"""Runtime: ONNX Runtime sessions and real batching, memory checks, precision variants.

Imports only ``facefuse.core``; no Triton module.
"""
