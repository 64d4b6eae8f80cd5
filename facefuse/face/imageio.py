"""Image bytes <-> RGB arrays, refusing bad uploads before they cost memory.

Invariants of :func:`decode_image`: the result is a C-contiguous ``uint8`` array of shape
``(H, W, 3)`` in RGB order, with EXIF orientation applied. The byte size, the format and the
pixel count are checked from the header before any pixel is decoded, so a decompression bomb
is refused without allocating its frame. Every refusal is an :class:`InvalidInput` naming
the field.
"""

from __future__ import annotations

import io
import struct
import warnings

import cv2
import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from facefuse.core.errors import FacefuseError, InvalidInput
from facefuse.core.limits import DEFAULT_LIMITS, Limits

# Magic numbers of formats people often send, to name them in the refusal.
_KNOWN_MAGIC = (
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
    (b"%PDF", "PDF"),
    (b"\x00\x00\x01\x00", "ICO"),
)


class PixelError(FacefuseError, ValueError):
    """A pixel array handed to an internal step is unusable (NaN, wrong dtype or shape).

    This is a server fault (for example a model that produced NaN), not a user error.
    """


def _as_bytes(data: object, field: str) -> bytes:
    if isinstance(data, np.ndarray) and data.dtype == np.uint8:
        return data.tobytes()
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise InvalidInput(field, f"must be image bytes, got {type(data).__name__}")


def _format_hint(data: bytes) -> str:
    for magic, name in _KNOWN_MAGIC:
        if data.startswith(magic):
            return f" (got {name})"
    return ""


def _open_header(data: bytes, field: str, limits: Limits) -> Image.Image:
    """Parse the header only (no pixel decoding); refuse unknown formats and bombs."""
    accepted = ", ".join(limits.image_formats)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=list(limits.image_formats))
    except Image.DecompressionBombError as exc:
        raise InvalidInput(
            field, f"must have at most {limits.max_image_pixels} pixels ({exc})"
        ) from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError):
        raise InvalidInput(
            field, f"must be a {accepted} image{_format_hint(data)}; could not read its header"
        ) from None
    if image.format not in limits.image_formats:
        raise InvalidInput(field, f"must be a {accepted} image, got {image.format}")
    return image


def _check_dimensions(image: Image.Image, field: str, limits: Limits) -> None:
    width, height = image.size
    if width * height > limits.max_image_pixels:
        raise InvalidInput(
            field,
            f"must have at most {limits.max_image_pixels} pixels, header says "
            f"{width}x{height} = {width * height}",
        )
    if min(width, height) < limits.min_image_side:
        raise InvalidInput(
            field,
            f"must be at least {limits.min_image_side} pixels on each side, got {width}x{height}",
        )


def _to_rgb(image: Image.Image) -> np.ndarray:
    """Any PIL mode -> RGB uint8; transparency is composited over white."""
    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        values = np.asarray(image, dtype=np.float64)
        top = 65535.0 if image.mode.startswith("I;16") or values.max() > 255 else 255.0
        gray = np.clip(np.rint(values * (255.0 / top)), 0, 255).astype(np.uint8)
        return np.repeat(gray[:, :, None], 3, axis=2)
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA", "La", "RGBa"):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        image = Image.alpha_composite(background, rgba)
    return np.asarray(image.convert("RGB"), dtype=np.uint8)


def decode_image(data: bytes, field: str, limits: Limits = DEFAULT_LIMITS) -> np.ndarray:
    """Decode an uploaded image to RGB ``uint8`` HxWx3, or raise InvalidInput naming ``field``.

    Order of checks: byte size, format (header), pixel count and minimum side (header),
    then the full decode (truncated or corrupt data is refused), EXIF orientation, and
    conversion of grayscale/palette/RGBA/CMYK/16-bit modes to RGB.
    """
    data = _as_bytes(data, field)
    if not data:
        raise InvalidInput(field, "must not be empty")
    if len(data) > limits.max_image_bytes:
        raise InvalidInput(
            field, f"must be at most {limits.max_image_bytes} bytes, got {len(data)}"
        )
    image = _open_header(data, field, limits)
    _check_dimensions(image, field, limits)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image.load()
            rgb = _to_rgb(_apply_orientation(image))
    except Image.DecompressionBombError:
        raise InvalidInput(field, f"must have at most {limits.max_image_pixels} pixels") from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise InvalidInput(field, f"is truncated or corrupt ({exc})") from None
    finally:
        image.close()
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.shape[0] * rgb.shape[1] > limits.max_image_pixels:
        raise InvalidInput(field, f"decoded to an unexpected shape {rgb.shape}")
    return np.ascontiguousarray(rgb)


def _apply_orientation(image: Image.Image) -> Image.Image:
    """Apply the EXIF orientation tag; a broken EXIF block counts as no orientation."""
    try:
        return ImageOps.exif_transpose(image)
    except (SyntaxError, ValueError, TypeError, KeyError, struct.error):
        return image


def encode_png(rgb: np.ndarray, compress_level: int = 1) -> bytes:
    """Encode an RGB ``uint8`` HxWx3 array as PNG; refuse anything else with PixelError.

    Float arrays are refused rather than silently cast (a NaN would become black pixels);
    convert with ``np.clip(x * 255, 0, 255).round().astype(np.uint8)`` first.

    OpenCV's encoder with zlib's run-length strategy: faster and smaller than Pillow at the same
    level 1 on a 512x512 photo (figures in docs/benchmarks.md).
    """
    array = np.asarray(rgb)
    if array.dtype != np.uint8:
        if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
            raise PixelError("encode_png: image contains NaN or infinite values")
        raise PixelError(f"encode_png: expected dtype uint8, got {array.dtype}")
    if array.ndim != 3 or array.shape[2] != 3 or array.shape[0] < 1 or array.shape[1] < 1:
        raise PixelError(f"encode_png: expected shape (H, W, 3), got {array.shape}")
    options = [cv2.IMWRITE_PNG_COMPRESSION, compress_level]
    options += [cv2.IMWRITE_PNG_STRATEGY, cv2.IMWRITE_PNG_STRATEGY_RLE]
    bgr = cv2.cvtColor(np.ascontiguousarray(array), cv2.COLOR_RGB2BGR)
    ok, encoded = cv2.imencode(".png", bgr, options)
    if not ok:
        raise PixelError(f"encode_png: OpenCV could not encode a {array.shape} image")
    return encoded.tobytes()
