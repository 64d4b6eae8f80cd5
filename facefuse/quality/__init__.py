"""Fidelity of the light variants: PSNR / SSIM metrics and the A/B fidelity gate.

``facefuse quality --reference fp32 --candidate int8`` (:mod:`.commands`) runs
:func:`.gate.run_gate`; :mod:`.metrics` holds PSNR and SSIM (scikit-image).
"""
