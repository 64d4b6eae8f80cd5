"""Unit-test fixtures: real photos that ship inside installed wheels, decoded to RGB arrays."""

from __future__ import annotations

import matplotlib.cbook
import numpy as np
import pytest
from PIL import Image
from skimage import data


@pytest.fixture(scope="session")
def astronaut() -> np.ndarray:
    """scikit-image's astronaut photo, 512x512 RGB uint8."""
    return data.astronaut()


@pytest.fixture(scope="session")
def grace() -> np.ndarray:
    """matplotlib's grace_hopper.jpg, 600x512 RGB uint8."""
    with matplotlib.cbook.get_sample_data("grace_hopper.jpg") as handle:
        return np.asarray(Image.open(handle).convert("RGB"))
