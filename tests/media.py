"""Small clips that tests make themselves (nothing from ../shared)."""

from __future__ import annotations

import numpy as np


def write_clip(path, frames, rate=25, audio=True, codec="libx264", gop=None):
    """``frames`` (RGB uint8, one size) as a clip at ``rate``, with a 440 Hz tone (AAC, mono,
    16 kHz) when ``audio``; a keyframe every ``gop`` frames when given. Returns ``path``."""
    import av

    height, width = frames[0].shape[:2]
    with av.open(str(path), "w") as out:
        video = out.add_stream(codec, rate=rate)
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        if gop is not None:
            video.options = {"g": str(gop), "keyint_min": str(gop), "sc_threshold": "0"}
        sound = None
        if audio:
            sound = out.add_stream("aac", rate=16000)
            sound.layout = "mono"
        samples = 0
        for rgb in frames:
            for packet in video.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")):
                out.mux(packet)
            if sound is not None:
                n = 16000 // rate
                t = (np.arange(samples, samples + n) / 16000.0).astype(np.float32)
                tone = (0.2 * np.sin(2 * np.pi * 440 * t))[None].astype(np.float32)
                chunk = av.AudioFrame.from_ndarray(tone, format="fltp", layout="mono")
                chunk.sample_rate, chunk.pts = 16000, samples
                samples += n
                for packet in sound.encode(chunk):
                    out.mux(packet)
        for stream in (video, sound):
            if stream is not None:
                for packet in stream.encode():
                    out.mux(packet)
    return path
