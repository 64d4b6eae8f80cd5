"""Which faces of B to fuse: the largest (default), all, or the one most like a reference face.

The reference comparison uses dlib's 128-d face descriptor (``dlib_face_recognition_resnet_
model_v1.dat`` from ``face_recognition_models``, CC0) on dlib's 5-point alignment, the models
the serving path already ships; distances below 0.6 mean the same person to dlib.
"""

from __future__ import annotations

import numpy as np

from facefuse.core.contract import REFERENCE_FACE
from facefuse.core.errors import NoFaceFound
from facefuse.face import models
from facefuse.face.detect import Face, find_face

SELECTS = ("largest", "all", "reference")
DESCRIPTOR_FILE = "dlib_face_recognition_resnet_model_v1.dat"


@models._per_thread
def _encoder():
    return models._require_dlib().face_recognition_model_v1(str(models.model_file(DESCRIPTOR_FILE)))


def descriptor(rgb: np.ndarray, face: Face) -> np.ndarray:
    """The 128-d descriptor of a detected face (aligned on dlib's 5 points of its box)."""
    dlib = models._require_dlib()
    x0, y0, x1, y1 = face.box
    shape = models.landmarks5()(np.ascontiguousarray(rgb), dlib.rectangle(x0, y0, x1 - 1, y1 - 1))
    return np.asarray(_encoder().compute_face_descriptor(np.ascontiguousarray(rgb), shape))


def choose(
    target_rgb: np.ndarray,
    faces: list[Face],
    select: str = "largest",
    reference_rgb: np.ndarray | None = None,
) -> tuple[list[int], dict]:
    """(indices into ``faces`` to fuse, in order; info). ``faces`` is largest first.

    "reference" needs ``reference_rgb``; a reference without a face raises
    :class:`~facefuse.core.errors.NoFaceFound` naming ``REFERENCE_FACE``."""
    if select not in SELECTS:
        raise ValueError(f"face select must be one of {SELECTS}, got {select!r}")
    info: dict = {"found": len(faces), "select": select}
    if select == "all":
        chosen = list(range(len(faces)))
    elif select == "reference":
        if reference_rgb is None:
            raise NoFaceFound(REFERENCE_FACE.name)
        reference = find_face(reference_rgb)
        if reference is None:
            raise NoFaceFound(REFERENCE_FACE.name)
        wanted = descriptor(reference_rgb, reference)
        distances = [float(np.linalg.norm(descriptor(target_rgb, f) - wanted)) for f in faces]
        chosen = [int(np.argmin(distances))]
        info["reference_distances"] = [round(d, 3) for d in distances]
    else:
        chosen = [0]
    info["fused"] = chosen
    info["boxes"] = [list(f.box) for f in faces]
    return chosen, info
