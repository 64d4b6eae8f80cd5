"""Real photos that ship inside installed wheels, for the demo, tests and load tests.

scikit-image's ``astronaut`` (Eileen Collins, NASA, public domain) and matplotlib's sample
``grace_hopper.jpg`` (public domain), so nothing is downloaded.
"""

from __future__ import annotations

import io
from pathlib import Path


def astronaut_png() -> bytes:
    """scikit-image's astronaut photo (512x512) as PNG bytes."""
    from PIL import Image
    from skimage import data

    buffer = io.BytesIO()
    Image.fromarray(data.astronaut()).save(buffer, format="PNG")
    return buffer.getvalue()


def grace_hopper_jpeg() -> bytes:
    """matplotlib's grace_hopper.jpg (512x600) as JPEG bytes."""
    from matplotlib import cbook

    return Path(cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)).read_bytes()


def sample_pair() -> tuple[bytes, bytes]:
    """(source A, target B): Grace Hopper's face into the astronaut photo."""
    return grace_hopper_jpeg(), astronaut_png()


def write_samples(folder: str | Path) -> tuple[Path, Path]:
    """Write the sample pair as files; returns (source path, target path)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    source, target = folder / "grace_hopper.jpg", folder / "astronaut.png"
    pair = sample_pair()
    source.write_bytes(pair[0])
    target.write_bytes(pair[1])
    return source, target
