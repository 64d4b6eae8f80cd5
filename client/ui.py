"""``facefuse ui``: a local web page (Gradio) that is a client like any other.

The page reaches the Triton server only through this package's client library: photos through
:class:`~facefuse.client.api.Client` (``facefusion``, ``txt2img``), videos through
:func:`~facefuse.client.video_job.fuse_video`, the camera through
:func:`~facefuse.client.stream.fuse_stream` (``facefusion_stream``, live). It has no second
pipeline and no route to Triton's admin APIs (model load/unload, shared memory, trace).

The handlers here are plain functions (tested without a browser); :func:`build_app` lays them
out with Gradio, imported only there (``facefuse[ui]``). Invariants:

- every error a person can cause (a wrong file, no face, a server down or busy, a camera
  stream that failed) comes back as a sentence in the page's status box; the page keeps
  working and the same button retries;
- uploads and results live in a private temporary folder that Gradio's cache cleaner empties
  (files older than ``KEEP_S``) and that is removed when the page stops;
- the page binds 127.0.0.1 unless told otherwise; with a token it asks for it before anything.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import shutil
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from facefuse.client.api import DEFAULT_URLS, Client, ClientError, RetryPolicy, read_image

from facefuse.core.errors import FacefuseError, InvalidInput

KEEP_S = 900  # uploads and results older than this are deleted (Gradio's cache cleaner)
UI_RETRY = RetryPolicy(attempts=3, deadline_s=30.0)  # a page should answer, not wait minutes
EXAMPLES = [
    "make them smile, keep the glasses",
    "keep the expression",
    "a slight smile, soft light",
    "让他微笑，保留眼镜",
    "保持表情",
    "",
]
STAGE_NAMES = {
    "face": "face analysis", "prompt": "prompt", "text_encoder": "text encoder",
    "vae_encoder": "VAE encode", "denoise": "denoising", "vae_decoder": "VAE decode",
    "paste_png": "paste and PNG",
}  # fmt: skip


def server_message(exc: BaseException, url: str) -> str:
    """One sentence for the status box: what went wrong and what to do."""
    text = str(exc)
    if isinstance(exc, InvalidInput):
        return f"**{exc.field}**: {exc.expectation}"
    lowered = text.lower()
    if "busy" in lowered or "unavailable" in lowered or "503" in text:
        return f"The server is busy or restarting a model: {text}. Press the button again."
    if "connect" in lowered or "refused" in lowered or "deadline" in lowered:
        return (
            f"No answer from the Triton server at {url}: {text}. Start it (`facefuse serve`) "
            "and press the button again."
        )
    return text


def _check_ready(client: Client) -> None:
    if not client.is_ready():
        raise ConnectionError(f"the server at {client.url} is not ready (failed to connect)")


def _path(value, field_name: str) -> Path:
    if value is None or value == "":
        raise InvalidInput(field_name, "is missing: add a file first")
    return Path(value)


def expression_options(manual: bool, smile: float, mouth_open: float, source: str) -> dict:
    """The request's expression fields: the sliders only when ``manual``, else the words."""
    options = {"expression_source": source or None}
    if manual:
        options.update(expression_smile=float(smile), expression_mouth_open=float(mouth_open))
    return options


def format_info(info: dict) -> str:
    """INFO as a person reads it (Markdown)."""
    lines = []
    if "tokens_before" in info:
        hits = info.get("cache_hit_tokens") or [0]
        lines.append(
            f"- **Prompt**: {info['tokens_before']} CLIP tokens, {info['tokens_after']} after "
            f"compression; the text encoder reused {hits[0]} cached prefix tokens"
        )
    if info.get("asked") == "nothing":
        lines.append("- **Asked**: nothing, a plain swap")
    if "steps" in info:
        run = info.get("steps_run", info["steps"])
        lines.append(
            f"- **Denoising**: {run} of {info['steps']} steps ({info.get('steps_policy', 'fixed')}"
            f", {info.get('scheduler', '?')}), UNet calls {info.get('unet_calls', '?')}"
        )
    if "variant" in info:
        lines.append(f"- **Served by**: the {info['variant']} variant of {info.get('model_id')}")
    expression = info.get("expression")
    if isinstance(expression, dict):
        whose = {"target": "B's", "source": "A's"}.get(expression.get("source"), "B's")
        parts = [f"{whose} expression"]
        for key in ("smile", "mouth_open"):  # the edit on top of that expression
            if isinstance(expression.get(key), (int, float)):
                parts.append(f"{key.replace('_', ' ')} {expression[key]:+.2f} on top")
        lines.append("- **Expression**: " + ", ".join(parts))
    faces = info.get("faces")
    if isinstance(faces, dict) and "found" in faces:
        fused = [index + 1 for index in faces.get("fused", [])]
        lines.append(
            f"- **Faces**: {faces['found']} found in B, fused: "
            f"{', '.join(map(str, fused)) or 'none'} ({faces.get('select', 'largest')})"
        )
    stages = info.get("stage_ms") or {}
    if stages:
        total = sum(stages.values())
        shown = ", ".join(f"{STAGE_NAMES.get(k, k)} {v:.0f}" for k, v in stages.items())
        lines.append(f"- **Time**: {total:.0f} ms ({shown})")
    return "\n".join(lines) or "(no INFO)"


@dataclass
class Page:
    """The handlers behind the page, bound to one server address."""

    url: str = DEFAULT_URLS["grpc"]
    timeout_s: float = 300.0
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="facefuse-ui-")))

    def client(self) -> Client:
        return Client(self.url, "grpc", self.timeout_s, retry=UI_RETRY)

    def _out(self, suffix: str) -> Path:
        handle, name = tempfile.mkstemp(suffix=suffix, dir=self.workdir)
        os.close(handle)
        return Path(name)

    def fuse_photo(self, source, target, instruction, manual, smile, mouth_open, expression_source,
                   face_select, reference=None) -> tuple[str | None, str, str]:  # fmt: skip
        """(result PNG path or None, INFO Markdown, status Markdown)."""
        try:
            a = read_image(_path(source, "A (source photo)"), "A (source photo)")
            b = read_image(_path(target, "B (target photo)"), "B (target photo)")
            ref = None
            if face_select == "reference":
                ref = read_image(_path(reference, "reference face"), "reference face")
            options = expression_options(manual, smile, mouth_open, expression_source)
            with self.client() as client:
                _check_ready(client)
                result = client.fuse(a, b, instruction or "", face_select=face_select,
                                     reference_face=ref, **options)  # fmt: skip
            out = self._out(".png")
            result.save(out)
            return str(out), format_info(result.info), "Done."
        except (FacefuseError, ConnectionError, OSError) as exc:
            return None, "", server_message(exc, self.url)

    def txt2img(self, prompt, steps, seed) -> tuple[str | None, str, str]:
        try:
            with self.client() as client:
                _check_ready(client)
                result = client.txt2img(prompt or "", steps=int(steps), seed=int(seed))
            out = self._out(".png")
            result.save(out)
            return str(out), format_info(result.info), "Done."
        except (FacefuseError, ConnectionError, OSError) as exc:
            return None, "", server_message(exc, self.url)

    def fuse_clip(self, source, target, instruction, manual, smile, mouth_open,
                  expression_source, face_select, progress=None):  # fmt: skip
        """(fused video path or None, status Markdown); ``progress(share, text)`` per frame."""
        from facefuse.client.video import probe
        from facefuse.client.video_job import fuse_video

        try:
            a = read_image(_path(source, "A (source photo)"), "A (source photo)")
            clip = _path(target, "B (video)")
            info = probe(clip, "B (video)")
            with self.client() as client:
                _check_ready(client)
            out = self._out(".mp4")
            started = time.perf_counter()

            def on_frame(done: int, total: int) -> None:
                if progress is not None:
                    speed = done / max(time.perf_counter() - started, 1e-6)
                    progress(min(done / max(total, 1), 1.0), f"{done}/{total} frames, "
                             f"{speed:.1f} frames/s")  # fmt: skip

            options = expression_options(manual, smile, mouth_open, expression_source)
            report = fuse_video(self.url, a, clip, out, instruction or "", on_frame=on_frame,
                                face_select=face_select, **options)  # fmt: skip
            s = report["summary"]
            return str(out), (
                f"Done: {s['frames']} frames of {info.width}x{info.height}, {s['fps']:.1f} "
                f"frames/s ({s['x_real_time']:.2f}x real time), sound "
                f"{'kept' if info.audio else 'none in B'}."
            )
        except (FacefuseError, ConnectionError, OSError) as exc:
            return None, server_message(exc, self.url)

    def samples(self) -> tuple[str, str]:
        """The bundled pair (public-domain photos from installed wheels) as files."""
        from facefuse.core.samples import write_samples

        return tuple(str(p) for p in write_samples(self.workdir / "samples"))

    def close(self) -> None:
        LIVE.close_all()
        shutil.rmtree(self.workdir, ignore_errors=True)


class LiveSession:
    """One camera's stream: frames pushed by the page go to a live ``fuse_stream`` (the newest
    waiting frame wins, the server drops what it cannot serve in time); :meth:`push` returns
    the latest fused frame. The stream ends after ``idle_s`` without a frame."""

    def __init__(self, url: str, source: bytes, instruction: str, options: dict,
                 idle_s: float = 3.0):  # fmt: skip
        self.url, self.source, self.instruction = url, source, instruction
        self.options, self.idle_s = options, idle_s
        self.frames: queue.Queue = queue.Queue(maxsize=1)
        self.latest: np.ndarray | None = None
        self.latency_ms: deque = deque(maxlen=90)
        self.received: deque = deque(maxlen=90)
        self.sent = self.delivered = self.dropped = 0
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._closed = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="facefuse-ui-live")
        self.thread.start()

    def _frames(self):
        begun = time.perf_counter()
        while not self._closed.is_set():
            try:
                rgb = self.frames.get(timeout=self.idle_s)
            except queue.Empty:
                return  # the camera stopped: END
            yield rgb, time.perf_counter() - begun

    def _run(self) -> None:
        from facefuse.client.stream import fuse_stream

        try:
            for frame in fuse_stream(self.url, self.source, self._frames(), self.instruction,
                                     live=True, **self.options):  # fmt: skip
                if frame.dropped:
                    self.dropped += 1
                    continue
                self.latest = frame.rgb
                self.delivered += 1
                self.latency_ms.append(frame.latency_ms)
                self.received.append(frame.received_at)
        except BaseException as exc:  # reported on the page by the next push
            self.error = exc
        finally:
            self.done.set()

    def push(self, rgb: np.ndarray) -> np.ndarray | None:
        """Hand one camera frame in; the latest fused frame (None before the first)."""
        if self.error is not None:
            raise self.error
        frame = np.ascontiguousarray(rgb[..., :3], dtype=np.uint8)
        with contextlib.suppress(queue.Empty):
            self.frames.get_nowait()  # a waiting older frame is replaced: the newest wins
        with contextlib.suppress(queue.Full):
            self.frames.put_nowait(frame)
        self.sent += 1
        return self.latest

    def stats(self) -> dict:
        latency = np.asarray(self.latency_ms or [np.nan])
        span = self.received[-1] - self.received[0] if len(self.received) > 1 else 0.0
        return {
            "latency_ms_p50": float(np.percentile(latency, 50)),
            "latency_ms_p95": float(np.percentile(latency, 95)),
            "delivered_fps": (len(self.received) - 1) / span if span > 0 else 0.0,
            "delivered": self.delivered, "dropped": self.dropped, "sent": self.sent,
        }  # fmt: skip

    def close(self) -> None:
        self._closed.set()
        self.done.wait(timeout=10)


class LiveSessions:
    """The page's live streams, one per browser session and choice of A and options."""

    def __init__(self):
        self._sessions: dict[str, tuple[str, LiveSession]] = {}
        self._lock = threading.Lock()

    def get(self, session: str, url: str, source: bytes, instruction: str,
            options: dict) -> LiveSession:  # fmt: skip
        key = hashlib.sha256(source + repr((instruction, sorted(options.items()))).encode())
        key = key.hexdigest()
        with self._lock:
            known = self._sessions.get(session)
            if known is not None and known[0] == key and not known[1].done.is_set():
                return known[1]
            if known is not None:
                threading.Thread(target=known[1].close, daemon=True).start()
            live = LiveSession(url, source, instruction, options)
            self._sessions[session] = (key, live)
            return live

    def close_all(self) -> None:
        with self._lock:
            sessions, self._sessions = list(self._sessions.values()), {}
        for _, live in sessions:
            live.close()


LIVE = LiveSessions()


def live_frame(page: Page, session: str, frame, source, instruction, face_select
               ) -> tuple[np.ndarray | None, str]:  # fmt: skip
    """One camera frame from the page: (the latest fused frame, the stats line)."""
    if frame is None:
        return None, "Waiting for the camera."
    try:
        a = read_image(_path(source, "A (source photo)"), "A (source photo)")
        live = LIVE.get(session, page.url, a, instruction or "", {"face_select": face_select})
        fused = live.push(np.asarray(frame))
    except (FacefuseError, ConnectionError, OSError) as exc:
        return None, server_message(exc, page.url)
    except Exception as exc:  # the stream failed (gRPC): say so, the next frame starts anew
        return None, server_message(ClientError(str(exc)), page.url)
    s = live.stats()
    if fused is None:
        return None, "Starting the stream (A's face is analysed once)..."
    return fused, (
        f"**{s['delivered_fps']:.1f} frames/s** delivered, latency p50 "
        f"{s['latency_ms_p50']:.0f} ms, p95 {s['latency_ms_p95']:.0f} ms "
        f"({s['delivered']} fused, {s['dropped']} dropped by the server)"
    )


def build_app(page: Page, max_file_mb: int = 200):
    """The Gradio Blocks page: A on the left, shared by the tabs Photo, Video, Live, txt2img."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    import gradio as gr

    faces = ["largest", "all", "reference"]
    image = {"type": "filepath", "sources": ["upload", "clipboard"]}

    def expression_controls(with_reference: bool):
        with gr.Accordion("Expression and faces", open=False):
            manual = gr.Checkbox(label="Set the expression with the sliders (otherwise: B's "
                                 "expression and the instruction's words)")  # fmt: skip
            smile = gr.Slider(-1.0, 2.0, value=0.0, step=0.05, label="Smile (-1 frown .. 2 big)")
            mouth = gr.Slider(0.0, 1.0, value=0.0, step=0.05, label="Mouth open (0 .. 1)")
            whose = gr.Radio(
                [("B's (target)", "target"), ("A's (source)", "source")],
                value="target",
                label="Whose expression to start from",
            )
            select = gr.Radio(faces if with_reference else faces[:2], value="largest",
                              label="Which faces of B to fuse")  # fmt: skip
            reference = None
            if with_reference:
                reference = gr.Image(label="Reference face (fuse the face of B most like it)",
                                     elem_id="reference", **image)  # fmt: skip
        return manual, smile, mouth, whose, select, reference

    with gr.Blocks(title="facefuse", delete_cache=(60, KEEP_S)) as app:
        gr.Markdown(
            "# facefuse\nPut the face of **A** into **B**: B's pose and expression kept, changed "
            f"as the instruction asks. Triton server: `{page.url}` (gRPC)."
        )
        with gr.Row():
            with gr.Column(scale=1, min_width=240):
                a = gr.Image(label="A: the face to use", elem_id="a", **image)
            with gr.Column(scale=3), gr.Tabs():
                with gr.Tab("Photo"):
                    with gr.Row():
                        b = gr.Image(label="B: the photo to put it into", elem_id="b", **image)
                        out = gr.Image(type="filepath", label="Result (A in B)", elem_id="out",
                                       interactive=False, buttons=["download"])  # fmt: skip
                    gr.Examples([list(page.samples())], inputs=[a, b], label="Try the bundled "
                                "pair (Grace Hopper as A, the astronaut as B)")  # fmt: skip
                    instruction = gr.Textbox(
                        label="Instruction (optional: empty is a plain swap)",
                        elem_id="instruction",
                        placeholder=EXAMPLES[0],
                    )
                    gr.Examples([[e] for e in EXAMPLES if e], inputs=[instruction],
                                label="Instructions to try")  # fmt: skip
                    controls = expression_controls(with_reference=True)
                    button = gr.Button("Fuse", variant="primary", elem_id="fuse")
                    status = gr.Markdown(elem_id="status")
                    info = gr.Markdown(elem_id="info")
                    button.click(page.fuse_photo, [a, b, instruction, *controls],
                                 [out, info, status])  # fmt: skip
                with gr.Tab("Video"):
                    with gr.Row():
                        vb = gr.Video(label="B: the video (its sound is kept)", elem_id="vb",
                                      sources=["upload"])  # fmt: skip
                        vout = gr.Video(label="Result", elem_id="vout", interactive=False)
                    vinstruction = gr.Textbox(
                        label="Instruction (optional)", elem_id="vinstruction"
                    )
                    vcontrols = expression_controls(with_reference=False)[:-1]
                    vbutton = gr.Button("Fuse the video", variant="primary", elem_id="vfuse")
                    vstatus = gr.Markdown(elem_id="vstatus")

                    def fuse_clip(*args, progress=gr.Progress()):  # noqa: B008 - Gradio's idiom
                        return page.fuse_clip(*args, progress=lambda share, text: progress(
                            share, text))  # fmt: skip

                    vbutton.click(fuse_clip, [a, vb, vinstruction, *vcontrols],
                                  [vout, vstatus])  # fmt: skip
                with gr.Tab("Live"):
                    gr.Markdown("Your camera fused with A as it streams. Frames the server "
                                "cannot serve in time are dropped: the newest wins.")  # fmt: skip
                    with gr.Row():
                        cam = gr.Image(sources=["webcam"], streaming=True, type="numpy",
                                       label="Camera", elem_id="cam",
                                       webcam_options=gr.WebcamOptions(mirror=False))  # fmt: skip
                        lout = gr.Image(label="Fused", elem_id="lout", interactive=False)
                    with gr.Row():
                        linstruction = gr.Textbox(label="Instruction (optional)",
                                                  elem_id="linstruction")  # fmt: skip
                        lselect = gr.Radio(faces[:2], value="largest", label="Which faces of B")
                    lstats = gr.Markdown("Press the camera's button to start.", elem_id="lstats")

                    def on_frame(frame, source, text, choice, request: gr.Request):
                        session = request.session_hash or ""
                        return live_frame(page, session, frame, source, text, choice)

                    on_frame.__annotations__["request"] = gr.Request  # a class, not a string
                    cam.stream(on_frame, [cam, a, linstruction, lselect], [lout, lstats],
                               stream_every=0.05, time_limit=600, concurrency_limit=4,
                               show_progress="hidden")  # fmt: skip
                with gr.Tab("txt2img"):
                    prompt = gr.Textbox(
                        label="Prompt",
                        elem_id="prompt",
                        value="portrait photo of a smiling woman, soft light",
                    )
                    with gr.Row():
                        steps = gr.Slider(1, 50, value=20, step=1, label="Denoising steps")
                        seed = gr.Number(value=0, precision=0, label="Seed (same seed, same image)")
                    tbutton = gr.Button("Generate", variant="primary", elem_id="generate")
                    tout = gr.Image(type="filepath", label="Portrait", elem_id="tout",
                                    interactive=False, buttons=["download"])  # fmt: skip
                    tstatus = gr.Markdown(elem_id="tstatus")
                    tinfo = gr.Markdown(elem_id="tinfo")
                    tbutton.click(page.txt2img, [prompt, steps, seed], [tout, tinfo, tstatus])
    app.max_file_size = max_file_mb * 1024 * 1024
    return app


def check_bind(host: str, allow_remote: bool) -> None:
    if host not in ("127.0.0.1", "localhost", "::1") and not allow_remote:
        raise InvalidInput("--host", f"{host} is not loopback: add --allow-remote (and a --token)")


def serve(url: str, host: str = "127.0.0.1", port: int = 7860, token: str | None = None,
          allow_remote: bool = False, max_file_mb: int = 200, block: bool = True):  # fmt: skip
    """Build and launch the page; returns (app, local url). ``token``: asked for at a login
    form (any user name, the token as password)."""
    import hmac

    check_bind(host, allow_remote)
    if not 1 <= int(port) <= 65535:
        raise InvalidInput("--port", f"must be in 1..65535, got {port}")
    page = Page(url)
    os.environ.setdefault("GRADIO_TEMP_DIR", str(page.workdir / "uploads"))
    app = build_app(page, max_file_mb)
    auth = None
    if token:
        auth = lambda _user, password: hmac.compare_digest(password, token)  # noqa: E731
    _, local, _ = app.launch(
        server_name=host, server_port=int(port), share=False, auth=auth,
        max_file_size=f"{int(max_file_mb)}mb", prevent_thread_lock=not block, quiet=True,
        footer_links=[], show_error=False, allowed_paths=[str(page.workdir)],
    )  # fmt: skip
    if block:
        page.close()
    return app, page, local
