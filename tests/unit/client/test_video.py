"""Video files in and out (facefuse.client.video): timing, audio copied, atomic output, and a
clear refusal of files that are not videos. Clips are made here with PyAV."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from facefuse.client.video import VideoWriter, audio_packets, probe, read_frames

from facefuse.core.errors import InvalidInput
from tests.media import write_clip

av = pytest.importorskip("av")


def make_clip(path, frames=12, rate=25, size=(96, 64), audio=True, codec="libx264", gop=None):
    """A short clip of moving bars with a sine tone (AAC) when ``audio``; a keyframe every
    ``gop`` frames when given."""
    width, height = size
    images = []
    for i in range(frames):
        rgb = np.zeros((height, width, 3), np.uint8)
        rgb[:, (i * 4) % width :, 0] = 200
        rgb[: height // 2, :, 1] = 40 * (i % 5)
        images.append(rgb)
    return write_clip(path, images, rate, audio, codec, gop)


def test_probe_and_frames_are_contiguous_rgb(tmp_path):
    clip = make_clip(tmp_path / "in.mp4")
    info = probe(clip)
    assert (info.width, info.height, info.rate) == (96, 64, Fraction(25))
    assert info.audio == ("aac",)
    frames = list(read_frames(clip))
    assert len(frames) == 12
    rgb, t, _ = frames[3]
    assert rgb.flags.c_contiguous and rgb.shape == (64, 96, 3) and rgb.dtype == np.uint8
    assert t == pytest.approx(3 / 25, abs=1e-3)


@pytest.mark.parametrize("suffix", [".mp4", ".mkv"])
def test_writer_keeps_timing_and_copies_audio_packet_for_packet(tmp_path, suffix):
    clip = make_clip(tmp_path / "in.mp4")
    info = probe(clip)
    out = tmp_path / f"out{suffix}"
    with VideoWriter(out, info) as writer:
        for rgb, _, pts in read_frames(clip):
            writer.write(255 - rgb, pts)
    result = probe(out)
    assert abs(len(list(read_frames(out))) - 12) <= 1
    assert result.rate == info.rate and (result.width, result.height) == (96, 64)
    assert audio_packets(out) == audio_packets(clip) and writer.audio_copied > 0
    first = next(read_frames(out))[0].astype(int)
    assert abs(first.mean() - (255 - next(read_frames(clip))[0].astype(int)).mean()) < 6


def test_an_interrupted_write_leaves_no_output(tmp_path):
    clip = make_clip(tmp_path / "in.mp4", audio=False)
    out = tmp_path / "out.mp4"
    with pytest.raises(RuntimeError), VideoWriter(out, probe(clip)) as writer:
        for rgb, _, pts in read_frames(clip):
            writer.write(rgb, pts)
            raise RuntimeError("the user pressed ctrl-c")
    assert not out.exists() and not list(tmp_path.glob(".out*"))


def test_webm_refuses_audio_it_cannot_carry(tmp_path):
    clip = make_clip(tmp_path / "in.mp4")
    with pytest.raises(InvalidInput, match="--output"):
        VideoWriter(tmp_path / "out.webm", probe(clip))
    with pytest.raises(InvalidInput, match="--output"):
        VideoWriter(tmp_path / "out.gif", probe(clip))


def test_bad_files_are_refused_naming_the_field(tmp_path):
    text = tmp_path / "notes.mp4"
    text.write_text("not a video at all")
    with pytest.raises(InvalidInput, match="--target"):
        probe(text)
    with pytest.raises(InvalidInput, match="not found"):
        probe(tmp_path / "missing.mp4")
    sound_only = tmp_path / "sound.m4a"
    with av.open(str(sound_only), "w", format="mp4") as out:
        stream = out.add_stream("aac", rate=16000)
        stream.layout = "mono"
        tone = np.zeros((1, 1024), np.float32)
        frame = av.AudioFrame.from_ndarray(tone, format="fltp", layout="mono")
        frame.sample_rate, frame.pts = 16000, 0
        for packet in [*stream.encode(frame), *stream.encode()]:
            out.mux(packet)
    with pytest.raises(InvalidInput, match="no video stream"):
        probe(sound_only)
    big = make_clip(tmp_path / "big.mp4", frames=2, size=(320, 240), audio=False)
    from facefuse.client.video import VideoLimits

    with pytest.raises(InvalidInput, match="pixels"):
        probe(big, limits=VideoLimits(max_pixels=100 * 100))
    with pytest.raises(InvalidInput, match="over"):
        probe(big, limits=VideoLimits(max_duration_s=0.01))


def test_keyframe_segments_decode_to_the_whole_clip(tmp_path):
    from facefuse.client.video import split_at_keyframes

    clip = make_clip(tmp_path / "gop.mp4", frames=30, audio=False, gop=10)
    segments = split_at_keyframes(clip, 3)
    assert [(s.first, s.frames) for s in segments] == [(0, 10), (10, 10), (20, 10)]
    assert [s.first for s in segments] == sorted({s.first for s in segments})
    whole = [(rgb, pts) for rgb, _, pts in read_frames(clip)]
    parts = [(rgb, pts) for s in segments
             for rgb, _, pts in read_frames(clip, "--target", s.start_pts, s.end_pts)]  # fmt: skip
    assert [p for _, p in parts] == [p for _, p in whole]
    assert all(np.array_equal(a, b) for (a, _), (b, _) in zip(parts, whole, strict=True))
    with pytest.raises(InvalidInput, match="--parallel"):
        split_at_keyframes(clip, 0)
    from facefuse.client.video_job import fuse_video

    with pytest.raises(InvalidInput, match=r"--parallel.*--live"):  # refused before connecting
        fuse_video("127.0.0.1:1", b"x", clip, tmp_path / "out.mp4", live=True, parallel=2)


def test_a_still_image_is_not_taken_for_a_video(tmp_path, sample_images):
    (tmp_path / "b.png").write_bytes(sample_images[1])
    with pytest.raises(InvalidInput, match="still image, not a video"):
        probe(tmp_path / "b.png", "--target")
