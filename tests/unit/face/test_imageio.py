"""decode_image / encode_png: accepted inputs, conversions, and every refusal naming the field."""

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image
from skimage import data

from facefuse.core.errors import InvalidInput
from facefuse.core.limits import Limits
from facefuse.face.imageio import PixelError, decode_image, encode_png

FIELD = "SOURCE_IMAGE"


def _save(image: Image.Image, fmt: str, **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **kwargs)
    return buffer.getvalue()


def _png_chunk(kind: bytes, payload: bytes) -> bytes:
    crc = zlib.crc32(kind + payload) & 0xFFFFFFFF
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", crc)


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height RGB pixels, with one tiny IDAT chunk."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 64)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"IDAT", idat)
        + _png_chunk(b"IEND", b"")
    )


@pytest.fixture(scope="module")
def astronaut():
    return data.astronaut()


def _refusal(data_bytes, limits=None, field=FIELD) -> InvalidInput:
    with pytest.raises(InvalidInput) as info:
        if limits is None:
            decode_image(data_bytes, field)
        else:
            decode_image(data_bytes, field, limits)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")
    return info.value


def test_png_round_trip_is_exact(astronaut):
    decoded = decode_image(encode_png(astronaut), FIELD)
    assert decoded.dtype == np.uint8 and decoded.shape == astronaut.shape
    assert decoded.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(decoded, astronaut)


def test_png_encoding_is_lossless_for_strided_views(astronaut):
    for view in (astronaut[:, ::-1], astronaut[::2, 1::3], astronaut[:37, :45]):
        np.testing.assert_array_equal(decode_image(encode_png(view), FIELD), view)


def test_jpeg_and_webp_decode_close_to_original(astronaut):
    for fmt in ("JPEG", "WEBP"):
        decoded = decode_image(_save(Image.fromarray(astronaut), fmt, quality=95), FIELD)
        assert decoded.shape == astronaut.shape
        assert np.abs(decoded.astype(int) - astronaut).mean() < 6, fmt


def test_bytes_like_inputs_are_accepted(astronaut):
    png = encode_png(astronaut[:64, :64])
    for variant in (bytearray(png), memoryview(png), np.frombuffer(png, dtype=np.uint8)):
        np.testing.assert_array_equal(decode_image(variant, FIELD), astronaut[:64, :64])


def test_grayscale_palette_and_cmyk_become_rgb(astronaut):
    gray = Image.fromarray(astronaut).convert("L")
    decoded = decode_image(_save(gray, "PNG"), FIELD)
    assert decoded.shape == (512, 512, 3)
    np.testing.assert_array_equal(decoded[:, :, 0], np.asarray(gray))
    np.testing.assert_array_equal(decoded[:, :, 0], decoded[:, :, 2])

    palette = Image.fromarray(astronaut).convert("P")
    decoded = decode_image(_save(palette, "PNG"), FIELD)
    np.testing.assert_array_equal(decoded, np.asarray(palette.convert("RGB")))

    cmyk = Image.fromarray(astronaut).convert("CMYK")
    decoded = decode_image(_save(cmyk, "JPEG", quality=95), FIELD)
    assert decoded.shape == (512, 512, 3) and decoded.dtype == np.uint8


def test_transparency_is_composited_over_white():
    rgba = np.zeros((40, 40, 4), dtype=np.uint8)
    rgba[:, :20] = (255, 0, 0, 255)  # opaque red on the left, fully transparent black right
    decoded = decode_image(_save(Image.fromarray(rgba, "RGBA"), "PNG"), FIELD)
    np.testing.assert_array_equal(decoded[0, 0], (255, 0, 0))
    np.testing.assert_array_equal(decoded[0, 39], (255, 255, 255))


def test_sixteen_bit_grayscale_is_scaled_not_clipped():
    values = np.full((40, 40), 32768, dtype=np.uint16)
    decoded = decode_image(_save(Image.fromarray(values), "PNG"), FIELD)
    assert decoded.shape == (40, 40, 3)
    assert 126 <= int(decoded[0, 0, 0]) <= 129


def test_exif_orientation_is_applied():
    pixels = np.zeros((40, 60, 3), dtype=np.uint8)  # 60 wide, 40 tall
    pixels[:, :30] = (255, 255, 255)  # white on the left half
    image = Image.fromarray(pixels)
    exif = image.getexif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to display"
    decoded = decode_image(_save(image, "JPEG", quality=95, exif=exif.tobytes()), FIELD)
    assert decoded.shape == (60, 40, 3)
    assert decoded[5, 20].mean() > 200  # the white left half is now on top
    assert decoded[55, 20].mean() < 50


def test_corrupt_bytes_are_refused():
    error = _refusal(b"this is not an image at all, just text" * 10)
    assert "PNG, JPEG, WEBP" in error.expectation


def test_truncated_image_is_refused(astronaut):
    png = encode_png(astronaut)
    error = _refusal(png[: len(png) // 2])
    assert "truncated or corrupt" in error.expectation


def test_decompression_bomb_header_is_refused_before_decoding():
    error = _refusal(_png_header_only(100_000, 100_000))
    assert "pixels" in error.expectation


def test_pixel_limit_is_checked_from_the_header():
    # 5000x5000 passes Pillow's own bomb guard but not ours; the body is nearly empty, so a
    # decode would fail as "truncated": the message shows the header check ran first.
    error = _refusal(_png_header_only(5000, 5000))
    assert "5000x5000" in error.expectation


@pytest.mark.parametrize("fmt", ["GIF", "BMP", "TIFF"])
def test_other_formats_are_refused(astronaut, fmt):
    error = _refusal(_save(Image.fromarray(astronaut[:64, :64]), fmt))
    assert f"got {fmt}" in error.expectation


def test_too_many_bytes_is_refused(astronaut):
    png = encode_png(astronaut)
    error = _refusal(png, Limits(max_image_bytes=len(png) - 1))
    assert str(len(png)) in error.expectation


def test_tiny_image_is_refused():
    tiny = np.full((8, 100, 3), 128, dtype=np.uint8)
    error = _refusal(encode_png(tiny), field="TARGET_IMAGE")
    assert "at least 32 pixels" in error.expectation


def test_empty_and_non_bytes_are_refused():
    _refusal(b"")
    _refusal("a string, not bytes")


def test_encode_png_refuses_float_nan_and_bad_shapes():
    with pytest.raises(PixelError, match="NaN"):
        encode_png(np.full((4, 4, 3), np.nan, dtype=np.float32))
    with pytest.raises(PixelError, match="uint8"):
        encode_png(np.zeros((4, 4, 3), dtype=np.float32))
    with pytest.raises(PixelError, match="shape"):
        encode_png(np.zeros((4, 4), dtype=np.uint8))
    with pytest.raises(PixelError, match="shape"):
        encode_png(np.zeros((4, 4, 4), dtype=np.uint8))


def test_encode_png_output_is_a_png(astronaut):
    png = encode_png(astronaut)
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    with Image.open(io.BytesIO(png)) as image:
        assert image.size == (512, 512) and image.mode == "RGB"
