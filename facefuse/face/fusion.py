"""Face fusion geometry: put face A onto face B before diffusion, and paste the result back.

:func:`prepare_fusion` detects both faces, aligns A onto B with a similarity transform of the
eyes (and nose), matches A's colours to B's skin in L*a*b*, and returns a :class:`FusionPlan`
for a square crop of B around the face. :func:`paste_back` puts a generated crop back into B.

Invariants: ``plan.mask`` is 1 where the diffusion model should regenerate, 0 where B must stay
as it is; :func:`paste_back` returns an image of B's exact shape whose pixels outside the crop
box or where the (resized) mask is 0 are bit-identical to B's.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

import cv2
import numpy as np

from facefuse.core.contract import SOURCE_IMAGE, TARGET_IMAGE
from facefuse.core.errors import NoFaceFound
from facefuse.face import detect, geometry
from facefuse.face.color import match_color, region_stats
from facefuse.face.detect import Face, detect_face, find_faces
from facefuse.face.expression import default_model as expression_model
from facefuse.face.expression import lip_gap
from facefuse.face.expression_edit import ExpressionEdit
from facefuse.face.facemesh import FACE_OVAL, LIPS_INNER, Mesh, face_mesh
from facefuse.face.imageio import PixelError
from facefuse.face.mask import FEATHER, feathered_ellipse, forehead_occlusion, paste_mask
from facefuse.face.warp import backward_map

SOURCE_FIELD, TARGET_FIELD = SOURCE_IMAGE.name, TARGET_IMAGE.name


@dataclass
class FusionPlan:
    """Everything the diffusion stage and :func:`paste_back` need.

    ``composite``: float32 [size, size, 3] in [0, 1], B's crop with A's face blended in.
    ``mask``: float32 [size, size] in [0, 1], 1 = regenerate.
    ``crop_box``: (x0, y0, x1, y1) in B's pixels, square, may extend past B only when B is
    smaller than the face needs. ``source_face``/``target_face``/``source_to_crop`` (A's
    pixels -> crop pixels, 2x3) are diagnostics and do not cross :meth:`to_arrays`.
    """

    composite: np.ndarray
    mask: np.ndarray
    crop_box: tuple[int, int, int, int]
    source_face: Face | None = None
    target_face: Face | None = None
    source_to_crop: np.ndarray | None = None
    info: dict | None = None  # what the face stage did (expression, faces), JSON-ready

    @property
    def size(self) -> int:
        return int(self.mask.shape[0])

    def to_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(composite float32 [S,S,3], mask float32 [S,S], crop_box int64 [4]) for Triton."""
        return (
            np.ascontiguousarray(self.composite, dtype=np.float32),
            np.ascontiguousarray(self.mask, dtype=np.float32),
            np.asarray(self.crop_box, dtype=np.int64),
        )

    @classmethod
    def from_arrays(
        cls, composite: np.ndarray, mask: np.ndarray, crop_box: np.ndarray
    ) -> FusionPlan:
        """Rebuild a plan from :meth:`to_arrays` output (leading batch axes of 1 are dropped)."""
        composite = np.asarray(composite, dtype=np.float32)
        mask = np.asarray(mask, dtype=np.float32)
        while composite.ndim > 3 and composite.shape[0] == 1:
            composite = composite[0]
        while mask.ndim > 2 and mask.shape[0] == 1:
            mask = mask[0]
        box = np.asarray(crop_box).reshape(-1)
        if mask.ndim != 2 or mask.shape[0] != mask.shape[1] or mask.shape[0] < 1:
            raise PixelError(f"FusionPlan: mask must be [S, S], got {mask.shape}")
        if composite.shape != (*mask.shape, 3):
            raise PixelError(
                f"FusionPlan: composite must be {(*mask.shape, 3)}, got {composite.shape}"
            )
        if box.shape != (4,) or not np.issubdtype(box.dtype, np.integer):
            raise PixelError(
                f"FusionPlan: crop_box must be 4 integers, got {box.dtype} {box.shape}"
            )
        x0, y0, x1, y1 = (int(v) for v in box)
        if x1 <= x0 or y1 <= y0:
            raise PixelError(f"FusionPlan: crop_box {box.tolist()} is empty")
        return cls(composite, mask, (x0, y0, x1, y1))


def _crop(rgb: np.ndarray, box: tuple[int, int, int, int], size: int) -> np.ndarray:
    """B's pixels in ``box`` (edge-replicated where it leaves the image), resized to size^2."""
    height, width = rgb.shape[:2]
    x0, y0, x1, y1 = box
    pad = (max(0, -y0), max(0, y1 - height), max(0, -x0), max(0, x1 - width))
    region = rgb[max(0, y0) : min(height, y1), max(0, x0) : min(width, x1)]
    if any(pad):
        region = cv2.copyMakeBorder(region, *pad, cv2.BORDER_REPLICATE)
    shrinking = (x1 - x0) > size
    interpolation = cv2.INTER_AREA if shrinking else cv2.INTER_CUBIC
    resized = cv2.resize(region, (size, size), interpolation=interpolation)
    return resized.astype(np.float32) / 255.0


# Both faces are detected at once, on two threads that each hold their own detectors
# (facefuse.face.models: per thread). dlib and OpenCV release the GIL, so on 2 cores the
# sample pair takes ~29 ms instead of ~49 ms; under load the work is the same.
_DETECT_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="facefuse-detect")


def _detect_both(source_rgb, target_rgb, stages) -> tuple[Face, Face]:
    """Both faces; the source's error wins when both images fail (as one after the other)."""
    source_job = _DETECT_POOL.submit(detect_face, source_rgb, SOURCE_FIELD, stages)
    target_job = _DETECT_POOL.submit(detect_face, target_rgb, TARGET_FIELD, stages)
    wait((source_job, target_job))
    return source_job.result(), target_job.result()


_LAST_FACES: list = []  # [(key, faces)]: "all" fuses face by face, each call finds B's again


def _faces_of(target_rgb: np.ndarray, stages, small: bool) -> list[Face]:
    """:func:`find_faces`; with ``small`` (``all``: one call per face of B, each finding them
    all again) the last image's answer is reused, the other selections call it once."""
    if not small:
        return find_faces(target_rgb, stages)
    key = (hashlib.blake2b(target_rgb.tobytes(), digest_size=16).digest(), target_rgb.shape,
           tuple(stages) if stages is not None else None, small)  # fmt: skip
    for seen, faces in list(_LAST_FACES):
        if seen == key:
            return list(faces)
    faces = find_faces(target_rgb, stages, small=small)
    _LAST_FACES[:] = [(key, tuple(faces))]
    return faces


def _detect_chosen(source_rgb, target_rgb, stages, edit: ExpressionEdit, reference_rgb):
    """A's main face, the chosen face of B (every face of B found, one chosen by the edit's
    selection and index) and the selection's info."""
    from facefuse.face.select import choose

    source_job = _DETECT_POOL.submit(detect_face, source_rgb, SOURCE_FIELD, stages)
    small = edit.face_select == "all"  # every face, the small ones too (detect.find_faces)
    target_job = _DETECT_POOL.submit(_faces_of, target_rgb, stages, small)
    wait((source_job, target_job))
    source_face, faces = source_job.result(), target_job.result()
    if not faces:
        raise NoFaceFound(TARGET_FIELD)
    chosen, info = choose(target_rgb, faces, edit.face_select, reference_rgb)
    if edit.face_index >= len(chosen):
        raise ValueError(f"face_index {edit.face_index} but {len(chosen)} face(s) chosen")
    info["this"] = chosen[edit.face_index]
    return source_face, faces[chosen[edit.face_index]], info


def warm_up(stages: Sequence[str] | None = None) -> None:
    """Build the detectors in both detection threads now (dlib's HOG takes seconds), e.g. in
    a Triton ``initialize``, so the first request does not pay for it."""
    both = threading.Barrier(2)  # each of the two workers takes one job

    def one():
        both.wait(timeout=60)
        detect.warm_up(stages)

    for job in [_DETECT_POOL.submit(one) for _ in range(2)]:
        job.result()


def prepare_fusion(
    source_rgb: np.ndarray,
    target_rgb: np.ndarray,
    size: int,
    stages: Sequence[str] | None = None,
    feather: float = FEATHER,
    expression: ExpressionEdit | None = None,
    reference_rgb: np.ndarray | None = None,
) -> FusionPlan:
    """Detect, align, colour-match and mask (``feather``: the mask's ramp width as a share of
    the face ellipse's shorter semi-axis); see the module docstring.

    ``expression``: A's face is first moved to the expression it asks for (B's by default,
    :class:`~facefuse.face.expression_edit.ExpressionEdit`): FaceMesh points of both faces,
    coefficients of :mod:`~facefuse.face.expression`, A's points retargeted, and A's pixels
    warped piecewise-affinely in the crop (one resampling from A's photo); ``plan.info``
    reports it, and A's fringe is left out of the paste
    (:func:`~facefuse.face.mask.forehead_occlusion`, ``forehead_hair_share`` in the info).
    None keeps A's expression (the paste of before). With ``expression`` every
    face of B is found and ``expression.face_select`` chooses which to fuse
    (:func:`~facefuse.face.select.choose`; "reference" compares with ``reference_rgb``); this
    call fuses the ``expression.face_index``-th of them and ``plan.info["faces"]`` says how
    many were found and which are fused.

    Raises NoFaceFound(SOURCE_FIELD) or NoFaceFound(TARGET_FIELD) when a face is missing.
    """
    if int(size) < 8:
        raise ValueError(f"prepare_fusion: size must be at least 8, got {size}")
    info: dict = {}
    if expression is None:
        source_face, target_face = _detect_both(source_rgb, target_rgb, stages)
        source, target_mesh = SourceAnalysis(source_rgb, source_face), None
    else:
        source_face, target_face, info["faces"] = _detect_chosen(
            source_rgb, target_rgb, stages, expression, reference_rgb
        )
        source_job = _DETECT_POOL.submit(face_mesh, source_rgb, source_face)
        target_mesh = face_mesh(target_rgb, target_face)
        source = SourceAnalysis(source_rgb, source_face, source_job.result())
    return compose(
        source, target_rgb, target_face, int(size), feather, expression, target_mesh, info
    )


@dataclass(frozen=True)
class SourceAnalysis:
    """What fusion needs of A, computed once per A (a stream keeps it for every frame; the
    still API keeps the last few by A's digest): the photo, its main face and, for the
    expression warp, its FaceMesh points and expression coefficients."""

    rgb: np.ndarray
    face: Face
    mesh: Mesh | None = None

    @functools.cached_property
    def coefficients(self) -> np.ndarray:
        if self.mesh is None:
            raise ValueError("SourceAnalysis: no mesh, so no expression coefficients")
        return expression_model().coefficients(self.mesh.points)


def analyze_source(
    rgb: np.ndarray, stages: Sequence[str] | None = None, with_mesh: bool = True
) -> SourceAnalysis:
    """A's face (the detector cascade; NoFaceFound(SOURCE_IMAGE) when none) and its mesh."""
    face = detect_face(rgb, SOURCE_FIELD, stages)
    return SourceAnalysis(rgb, face, face_mesh(rgb, face) if with_mesh else None)


def compose(
    source: SourceAnalysis,
    target_rgb: np.ndarray,
    target_face: Face,
    size: int,
    feather: float = FEATHER,
    expression: ExpressionEdit | None = None,
    target_mesh: Mesh | None = None,
    info: dict | None = None,
    colour: Callable[[np.ndarray], np.ndarray] | None = None,
) -> FusionPlan:
    """The plan for A (analysed) onto one face of B (found, and with ``expression`` meshed):
    align, warp to the wanted expression, colour-match, mask, composite. The still API
    (:func:`prepare_fusion`) and the stream (``facefuse.diffusion.stream``) both come here.
    ``colour``: maps B's L*a*b* statistics of the face ((2, 3): mean, std) to those A is
    matched to (a stream smooths them over time); None uses this frame's own."""
    info = {} if info is None else info
    source_rgb, source_face = source.rgb, source.face
    ellipse = geometry.face_ellipse(target_face.left_eye, target_face.right_eye)
    box = geometry.crop_box(ellipse, target_rgb.shape)
    image_to_crop = geometry.box_to_square(box, size)
    crop_ellipse = ellipse.mapped(image_to_crop)

    source_points, target_points = source_face.alignment_points(), target_face.alignment_points()
    count = min(len(source_points), len(target_points))
    source_to_target = geometry.similarity_transform(source_points[:count], target_points[:count])
    source_to_crop = geometry.compose(image_to_crop, source_to_target)

    outline = None
    if expression is not None:
        if source.mesh is None or target_mesh is None:
            raise ValueError("compose: the expression warp needs both faces' meshes")
        warped, coverage, info["expression"], mouth, outline = _expression_warp(
            source,
            target_mesh,
            source_to_crop,
            image_to_crop,
            size,
            expression,
        )
    else:
        warped = (
            cv2.warpAffine(
                source_rgb,
                source_to_crop,
                (size, size),
                flags=cv2.INTER_LINEAR,
                borderMode=cv2.BORDER_REPLICATE,
            ).astype(np.float32)
            / 255.0
        )
        coverage = cv2.warpAffine(
            np.ones(source_rgb.shape[:2], np.float32),
            source_to_crop,
            (size, size),
            flags=cv2.INTER_LINEAR,
        )
    target_crop = _crop(target_rgb, box, size)
    mask = feathered_ellipse(crop_ellipse, (size, size), feather)
    face_region = mask > 0.5  # colour statistics and A's skin colour: the ellipse's inside
    if outline is not None:  # A's cheeks and jaw too, up to A's own outline
        mask = paste_mask(crop_ellipse, outline, (size, size), feather)
    stats = None
    if colour is not None:
        stats = colour(region_stats(target_crop, face_region))
    matched = match_color(
        warped, target_crop, face_region & (coverage > 0.99), face_region, target_stats=stats
    )
    if expression is not None:
        matched, info["expression"]["mouth_interior"] = fill_mouth(
            matched, target_crop, *mouth, face_region=face_region
        )
    alpha = mask * np.clip(coverage, 0.0, 1.0)
    if expression is not None:  # A's hair over its forehead is not pasted onto B's
        eyes = geometry.apply(
            image_to_crop, np.array([target_face.left_eye, target_face.right_eye])
        )
        keep = forehead_occlusion(matched, (tuple(eyes[0]), tuple(eyes[1])), face_region)
        info["expression"]["forehead_hair_share"] = round(
            float(1.0 - keep[face_region].mean()) if face_region.any() else 0.0, 4
        )
        alpha = alpha * keep
    alpha = alpha[:, :, None]
    composite = target_crop * (1.0 - alpha) + matched * alpha
    return FusionPlan(
        composite=np.clip(composite, 0.0, 1.0).astype(np.float32),
        mask=mask,
        crop_box=box,
        source_face=source_face,
        target_face=target_face,
        source_to_crop=source_to_crop,
        info=info,
    )


def _expression_warp(
    source: SourceAnalysis,
    target_mesh: Mesh,
    source_to_crop: np.ndarray,
    image_to_crop: np.ndarray,
    size: int,
    edit: ExpressionEdit,
) -> tuple[np.ndarray, np.ndarray, dict, tuple, np.ndarray]:
    """(A warped into the crop with the wanted expression, its coverage, info, the mouth:
    (A's moved inner lips, B's inner lips, both in crop pixels, B's lip parting), A's moved
    face oval in crop pixels)."""
    model = expression_model()
    source_rgb, source_mesh = source.rgb, source.mesh
    own, theirs = source.coefficients, model.coefficients(target_mesh.points)
    wanted, applied = edit.wanted(own, theirs, model.neutral_band)
    moved = model.retarget(source_mesh.points, own, wanted)
    if edit.follow_target:  # a stream: B's lip parting and eye opening, frame by frame
        from facefuse.face import lips

        gap = edit.target_lip_gap
        moved = lips.follow_lip_gap(moved, lips.lip_gap(target_mesh.points) if gap is None else gap)
        if edit.target_eye_ratio is not None:
            moved = lips.follow_eye_opening(moved, np.asarray(edit.target_eye_ratio))
    map_x, map_y = backward_map(
        geometry.apply(source_to_crop, source_mesh.points),
        geometry.apply(source_to_crop, moved),
        (size, size),
    )
    to_source = cv2.invertAffineTransform(source_to_crop)  # crop pixels -> A's pixels
    source_x = (to_source[0, 0] * map_x + to_source[0, 1] * map_y + to_source[0, 2]).astype(
        np.float32
    )
    source_y = (to_source[1, 0] * map_x + to_source[1, 1] * map_y + to_source[1, 2]).astype(
        np.float32
    )
    warped = (
        cv2.remap(
            source_rgb, source_x, source_y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE
        ).astype(np.float32)
        / 255.0
    )
    coverage = cv2.remap(
        np.ones(source_rgb.shape[:2], np.float32), source_x, source_y, cv2.INTER_LINEAR,
        borderMode=cv2.BORDER_CONSTANT, borderValue=0.0,
    )  # fmt: skip
    info = {
        **applied,
        "coefficients": {
            "source": model.as_dict(own),
            "target": model.as_dict(theirs),
            "applied": model.as_dict(wanted),
        },
        "landmarks": "facemesh-468",
        "moved_eye_spans": round(
            float(np.abs(moved - source_mesh.points).max() / source_mesh.eye_span), 4
        ),
    }
    inner = list(LIPS_INNER)
    mouth = (
        geometry.apply(source_to_crop, moved[inner]),
        geometry.apply(image_to_crop, target_mesh.points[inner]),
        lip_gap(target_mesh.points),
        applied["expression"]["applied"]["mouth_open"] > 0.5,
        geometry.apply(source_to_crop, source_mesh.points[inner]),
    )
    return warped, coverage, info, mouth, geometry.apply(source_to_crop, moved[list(FACE_OVAL)])


# lips parted by more than this (outer-eye spans) get a mouth interior: B's own, warped into
# A's lips, when B's are parted too; else a dark one (diffusion paints over it where it runs)
OPEN_FILL = 0.04
DARK_MOUTH = np.array([0.22, 0.08, 0.08], np.float32)
TEETH = np.array([0.8, 0.76, 0.7], np.float32)  # a smile's parted lips show teeth


def fill_mouth(
    crop: np.ndarray, target_crop: np.ndarray, lips: np.ndarray, target_lips: np.ndarray,
    target_gap: float, opened: bool = False, own_lips: np.ndarray | None = None,
    face_region: np.ndarray | None = None,
) -> tuple[np.ndarray, str]:  # fmt: skip
    """``crop`` with the inside of ``lips`` (inner-lip contour, crop pixels) filled, and which
    fill: "none", "target" (B's interior warped from ``target_lips``), "dark" (an opened
    mouth, ``opened``) or "teeth" (a smile's parted lips). ``own_lips``: A's inner lips before
    the warp; only what the warp opened beyond them is filled (A's own parted lips carry their
    own teeth along)."""
    span_points = lips[[0, 10]]  # the inner contour's two corners
    width = float(np.linalg.norm(span_points[1] - span_points[0]))
    gap = float(np.linalg.norm(lips[5] - lips[15]))  # inner middle: upper 13, lower 14
    if own_lips is not None:
        gap -= float(np.linalg.norm(own_lips[5] - own_lips[15]))
    if width < 1.0 or gap < OPEN_FILL * 2.2 * width:  # mouth width is ~0.45 eye spans
        return crop, "none"
    size = crop.shape[0]
    inside = np.zeros((size, size), np.uint8)
    cv2.fillPoly(inside, [np.round(lips * 16).astype(np.int32)], 255, cv2.LINE_AA, 4)
    weight = cv2.GaussianBlur(inside.astype(np.float32) / 255.0, (3, 3), 0)[..., None]
    if target_gap > OPEN_FILL:
        map_x, map_y = backward_map(target_lips, lips, (size, size))
        interior = cv2.remap(target_crop, map_x, map_y, cv2.INTER_LINEAR,
                             borderMode=cv2.BORDER_REPLICATE)  # fmt: skip
        kind = "target"
    else:  # shaded: dark at the lips, the fill's colour only in the middle
        kind = "dark" if opened else "teeth"
        depth = cv2.distanceTransform((inside > 127).astype(np.uint8), cv2.DIST_L2, 3)
        shade = np.clip(depth / max(float(depth.max()) * 0.8, 1e-6), 0.0, 1.0)[..., None]
        colour = DARK_MOUTH if opened else TEETH
        interior = (DARK_MOUTH + (colour - DARK_MOUTH) * shade) * _light(crop, face_region)
    return (crop * (1.0 - weight) + interior * weight).astype(np.float32), kind


# a studio face's mean luma (Rec. 601) in [0, 1]; a face darker than this gets its shaded
# mouth dimmed in proportion
STUDIO_LUMA = 0.5


def _light(crop: np.ndarray, face_region: np.ndarray | None) -> float:
    """1 for a face at least as bright as :data:`STUDIO_LUMA`, its luma over that below."""
    if face_region is None or not face_region.any():
        return 1.0
    luma = float((crop[face_region] @ np.array([0.299, 0.587, 0.114], np.float32)).mean())
    return float(np.clip(luma / STUDIO_LUMA, 0.25, 1.0))


def paste_back(target_rgb: np.ndarray, generated: np.ndarray, plan: FusionPlan) -> np.ndarray:
    """B with the generated crop blended in by the plan's mask; uint8, B's exact shape.

    ``generated`` is float [size, size, 3] in [0, 1] (values outside are clipped). NaN or
    infinite values in it or in the mask raise :class:`PixelError` instead of producing a
    black patch.
    """
    target = np.asarray(target_rgb)
    if target.dtype != np.uint8 or target.ndim != 3 or target.shape[2] != 3:
        raise PixelError(
            f"paste_back: target must be RGB uint8 (H, W, 3), got {target.dtype} {target.shape}"
        )
    generated = np.asarray(generated)
    while generated.ndim > 3 and generated.shape[0] == 1:
        generated = generated[0]
    size = plan.size
    if generated.shape != (size, size, 3):
        raise PixelError(
            f"paste_back: generated crop must be {(size, size, 3)}, got {generated.shape}"
        )
    if not np.isfinite(generated).all():
        raise PixelError("paste_back: the generated image contains NaN or infinite values")
    if not np.isfinite(plan.mask).all():
        raise PixelError("paste_back: the mask contains NaN or infinite values")

    height, width = target.shape[:2]
    x0, y0, x1, y1 = plan.crop_box
    ix0, iy0, ix1, iy1 = max(0, x0), max(0, y0), min(width, x1), min(height, y1)
    result = target.copy()
    if ix1 <= ix0 or iy1 <= iy0:
        return result
    box_w, box_h = x1 - x0, y1 - y0
    pixels8 = np.rint(np.clip(generated, 0.0, 1.0) * 255.0).astype(np.uint8)
    interpolation = cv2.INTER_AREA if box_w < size else cv2.INTER_CUBIC
    pixels = cv2.resize(pixels8, (box_w, box_h), interpolation=interpolation)
    mask = cv2.resize(
        np.clip(plan.mask, 0.0, 1.0).astype(np.float32),
        (box_w, box_h),
        interpolation=cv2.INTER_LINEAR,
    )
    mask = mask[iy0 - y0 : iy1 - y0, ix0 - x0 : ix1 - x0]
    rows, cols = np.flatnonzero(mask.max(axis=1) > 0), np.flatnonzero(mask.max(axis=0) > 0)
    if not len(rows):
        return result
    # only the mask's bounding window is touched; inside it, pixels with mask 0 keep B's value
    r0, r1, c0, c1 = rows[0], rows[-1] + 1, cols[0], cols[-1] + 1
    weight = np.ascontiguousarray(mask[r0:r1, c0:c1])
    ty, tx = iy0 + r0, ix0 + c0
    original = np.ascontiguousarray(target[ty : ty + (r1 - r0), tx : tx + (c1 - c0)])
    new = np.ascontiguousarray(pixels[iy0 - y0 + r0 : iy0 - y0 + r1, ix0 - x0 + c0 : ix0 - x0 + c1])
    blended = cv2.blendLinear(original, new, 1.0 - weight, weight)
    window = result[ty : ty + (r1 - r0), tx : tx + (c1 - c0)]
    np.copyto(window, blended, where=(weight > 0)[:, :, None])
    return result
