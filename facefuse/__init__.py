"""facefuse: Stable-Diffusion face fusion served by NVIDIA Triton, fast and cheap.

The library imports no Triton module at top level, so every part is unit-testable
without a server.
"""

__version__ = "0.1.0"
