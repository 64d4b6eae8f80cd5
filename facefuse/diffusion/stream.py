"""Video and live fusion: one stream of B's frames fused with one A, frame by frame.

A :class:`StreamSession` holds what a stream computes once (A's analysis, the instruction's
encoded prompt and expression edit) and what it carries from frame to frame (B's tracked faces,
:mod:`facefuse.face.track`; the colour statistics, smoothed; the last diffusion residual of each
face; B's lips at rest). Each frame then runs, for each tracked face, the still API's own face
stage (:func:`facefuse.face.fusion.compose`) and, on key frames, its own diffusion
(:meth:`facefuse.diffusion.pipeline.Pipeline.refine`): one library path for stills and streams.

Key frames (``refine_every``): diffusion runs on a face's first frame and every N-th after; the
frames between add that key frame's residual (what diffusion changed, in the face-aligned crop)
to their own composite, so each frame keeps its own warp, mouth and eyes and pays diffusion's
price only once in N frames. With ``refine_every`` 1 every frame is diffused; 0 never.

:class:`StreamRunner` pipelines a session: frames are tracked and composed in order on one
thread, key frames' diffusion runs on a shared pool (several frames of a stream, and several
streams, in flight at once, so the UNet's batcher sees batches), and results leave in frame order.
Offline (``live`` False) a frame waits for the key frame it depends on and nothing is dropped:
the same frames give the same video. Live, the newest frame wins: a frame still waiting to start
when a newer one arrives is dropped (and reported), and a frame uses the newest residual ready.
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from facefuse.core.errors import Busy, InvalidInput, NoFaceFound
from facefuse.core.limits import GenerationParams
from facefuse.diffusion.pipeline import Pipeline, Timer

FRAME_FIELD = "FRAME"


@dataclass(frozen=True)
class StreamSettings:
    """How a stream runs (the ``facefusion_stream`` model's parameters).

    ``refine_every``: diffusion on a face's first frame and every N-th after (0: never);
    ``max_in_flight``: frames of one stream accepted and not yet answered (more are refused as
    busy offline, or drop the oldest waiting one live); ``live``: the newest frame wins;
    ``colour_cutoff``: smoothing of B's colour statistics (the share of the new frame's, per
    frame; 1 = no smoothing); ``select``: "largest" or "all" of B's faces."""

    refine_every: int = 12
    max_in_flight: int = 4
    live: bool = False
    colour_share: float = 0.25
    select: str = "largest"
    track: object = None  # facefuse.face.track.TrackSettings (None: its defaults)

    def __post_init__(self) -> None:
        if self.refine_every < 0:
            raise InvalidInput("refine_every", f"must be >= 0, got {self.refine_every}")
        if not 1 <= self.max_in_flight <= 64:
            raise InvalidInput("max_in_flight", f"must be in 1..64, got {self.max_in_flight}")
        if not 0.0 < self.colour_share <= 1.0:
            raise InvalidInput("colour_share", f"must be in (0, 1], got {self.colour_share}")
        if self.select not in ("largest", "all"):
            raise InvalidInput("FACE_SELECT", f"must be largest or all, got {self.select!r}")


@dataclass
class FaceWork:
    """One face of one frame between composing and pasting."""

    track_key: int
    plan: object  # facefuse.face.fusion.FusionPlan
    key: bool  # this frame runs diffusion for this face
    residual: Future | None = None  # the key frame's residual this face adds (None: none)
    info: dict = field(default_factory=dict)
    state: object = None  # the face's _FaceState (live frames read its newest residual)


@dataclass
class FrameWork:
    index: int
    rgb: np.ndarray
    t: float
    faces: list[FaceWork]
    timer: Timer
    received: float  # time.perf_counter() when the frame came in


@dataclass
class FrameResult:
    """A fused frame (uint8 HxWx3, the input's size) and its INFO."""

    index: int
    rgb: np.ndarray | None
    info: dict


class _ColourFilter:
    """Exponential smoothing of B's L*a*b* statistics (mean, std) per face."""

    def __init__(self, share: float):
        self.share, self.value = share, None

    def __call__(self, stats: np.ndarray | None) -> np.ndarray | None:
        if stats is None:
            return self.value
        self.value = stats if self.value is None else self.value + self.share * (stats - self.value)
        return self.value


@dataclass
class _FaceState:
    """What a stream carries for one of B's tracked faces."""

    colour: _ColourFilter
    eyes_open: np.ndarray | None = None  # B's widest eye opening so far (per eye)
    residual: Future | None = None  # the last key frame's residual (crop-sized float32)
    frames: int = 0
    ready: tuple[int, Future] | None = None  # the newest finished residual: (key frame, it)

    def finished(self, frame: int, future: Future) -> None:
        """A key frame's diffusion ended: the newest one finished is what live frames use."""
        if not future.cancelled() and future.exception() is None:
            if self.ready is None or self.ready[0] < frame:
                self.ready = (frame, future)


def _done(value) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


class StreamSession:
    """One stream's state; :meth:`prepare` (in frame order), :meth:`diffuse` (any order, any
    thread) and :meth:`finish` (in frame order) make one frame. See the module docstring."""

    def __init__(
        self,
        pipeline: Pipeline,
        source_rgb: np.ndarray,
        instruction: str,
        params: GenerationParams,
        expression: dict | None = None,
        settings: StreamSettings | None = None,
    ):
        from facefuse.face.expression_edit import ExpressionEdit, words_from_instruction
        from facefuse.face.facemesh import face_mesh
        from facefuse.face.fusion import SourceAnalysis, analyze_source
        from facefuse.face.track import FaceTracker, face_from_mesh

        self.pipeline, self.params = pipeline, params
        self.settings = settings or StreamSettings()
        started = time.perf_counter()
        found = analyze_source(np.ascontiguousarray(source_rgb), with_mesh=False)
        mesh = face_mesh(found.rgb, found.face)
        # A's face from its mesh, as B's tracked faces are: alignment compares like with like
        self.source = SourceAnalysis(found.rgb, face_from_mesh(mesh, found.rgb.shape), mesh)
        self.source.coefficients  # noqa: B018 - computed once, here
        fields = {k: v for k, v in (expression or {}).items() if k != "face_select"}
        words = words_from_instruction(instruction)
        self.edit = ExpressionEdit(**fields, words=words, follow_target=True)
        self.context, self.prompt_info = (None, {})
        if self.settings.refine_every > 0:
            self.context, self.prompt_info = pipeline.encode_prompt(instruction)
        self.tracker = FaceTracker(self.settings.track, select=self.settings.select)
        self._faces: dict[int, _FaceState] = {}
        self.frames = 0
        self.setup_ms = round(1000 * (time.perf_counter() - started), 2)

    def _state(self, track) -> _FaceState:
        key = id(track)
        if key not in self._faces:
            self._faces[key] = _FaceState(_ColourFilter(self.settings.colour_share))
        return self._faces[key]

    def prepare(self, rgb: np.ndarray, t: float, received: float | None = None) -> FrameWork:
        """Track B's faces in this frame and compose each (in frame order, one thread)."""
        from dataclasses import replace

        from facefuse.face.fusion import compose
        from facefuse.face.lips import eye_opening, lip_gap

        if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
            raise InvalidInput(FRAME_FIELD, f"must be uint8 [H, W, 3], got {rgb.dtype} {rgb.shape}")
        rgb = np.ascontiguousarray(rgb)
        timer = Timer()
        tracks = timer.run("track", self.tracker.update, rgb, t)
        live = {id(track) for track in tracks}
        for key in [k for k in self._faces if k not in live]:
            del self._faces[key]  # a lost face's state goes with it
        faces = []
        for track in tracks:
            state = self._state(track)
            eyes = eye_opening(track.raw.points)  # lids and lips: B's own, unsmoothed
            state.eyes_open = eyes if state.eyes_open is None else np.maximum(state.eyes_open, eyes)
            ratio = tuple(float(v) for v in eyes / np.maximum(state.eyes_open, 1e-6))
            edit = replace(
                self.edit,
                target_eye_ratio=ratio,
                target_lip_gap=lip_gap(track.raw.points),
            )
            size = self.pipeline.manifest.image_size
            plan = timer.run(
                "compose",
                functools.partial(
                    compose, self.source, rgb, track.face, size, expression=edit,
                    target_mesh=track.mesh, colour=state.colour,
                ),
            )  # fmt: skip
            every = self.settings.refine_every
            key = every > 0 and state.frames % every == 0
            state.frames += 1
            faces.append(FaceWork(id(track), plan, key, state.residual, state=state))
        work = FrameWork(self.frames, rgb, t, faces, timer, received or time.perf_counter())
        self.frames += 1
        return work

    def diffuse(self, face: FaceWork, timer: Timer) -> np.ndarray:
        """A key frame's diffusion for one face: the residual (fused crop - composite)."""
        plan = face.plan
        fused, result = self.pipeline.refine(
            timer, plan.composite, plan.mask, self.params, self.context
        )
        face.info["unet_calls"] = result.unet_calls
        return (fused - plan.composite).astype(np.float32)

    def schedule(self, work: FrameWork, pool: ThreadPoolExecutor | None) -> None:
        """Start each key face's diffusion (on ``pool``, or here when None) and record it as
        the residual that face's next frames add."""
        for face in work.faces:
            if not face.key:
                continue
            if pool is None:
                face.residual = _done(self.diffuse(face, work.timer))
            else:
                face.residual = pool.submit(self.diffuse, face, work.timer)
            state, index = face.state, work.index
            state.residual = face.residual
            face.residual.add_done_callback(lambda f, s=state, i=index: s.finished(i, f))

    def finish(self, work: FrameWork, wait: bool = True) -> FrameResult:
        """Add each face's residual and paste the faces into the frame (in frame order).
        ``wait`` False (live) uses the newest residual that is ready instead of waiting for a
        key frame still running (none yet: the composite as it is)."""
        from facefuse.face.fusion import FusionPlan, paste_back

        started = time.perf_counter()
        out = work.rgb
        faces_info = []
        for face in work.faces:
            plan = face.plan
            crop = plan.composite
            residual = face.residual
            if not wait and face.state is not None:  # live: the newest finished one
                ready = face.state.ready
                residual = None if ready is None else ready[1]
            if residual is not None:
                crop = np.clip(plan.composite + residual.result(), 0.0, 1.0)
            mask_plan = FusionPlan(crop, plan.mask, plan.crop_box)
            out = paste_back(out, crop, mask_plan)
            faces_info.append(
                {
                    "box": [int(v) for v in plan.crop_box],
                    "key": face.key,
                    "diffused": residual is not None,
                    "mouth_interior": (plan.info or {}).get("expression", {}).get("mouth_interior"),
                    **face.info,
                }
            )
        work.timer.ms["paste"] = round(1000 * (time.perf_counter() - started), 2)
        info = {
            "frame": work.index,
            "faces": faces_info,
            "faces_found": len(work.faces),
            "stage_ms": work.timer.ms,
            "latency_ms": round(1000 * (time.perf_counter() - work.received), 2),
        }
        return FrameResult(work.index, out, info)

    def fuse_frame(self, rgb: np.ndarray, t: float) -> FrameResult:
        """One frame start to end on this thread (tests, the simplest callers)."""
        work = self.prepare(rgb, t)
        self.schedule(work, None)
        return self.finish(work)


class StreamBusy(Busy):
    """More frames in flight than the stream allows: retry when an answer has come back."""

    def __init__(self, limit: int):
        super().__init__(f"{limit} frames of this stream in flight")


_STOP = object()


class StreamRunner:
    """Runs a :class:`StreamSession` pipelined (see the module docstring); ``emit(result)``
    is called once per submitted frame, in frame order (a dropped live frame: ``rgb`` None and
    ``info["dropped"]`` True). ``close()`` finishes what was submitted and stops the threads."""

    def __init__(
        self,
        session: StreamSession,
        emit: Callable[[FrameResult], None],
        pool: ThreadPoolExecutor | None = None,
    ):
        self.session, self.emit, self.pool = session, emit, pool
        settings = session.settings
        self.live, self.limit = settings.live, settings.max_in_flight
        self._waiting: list[tuple] = []  # frames not started (live drops from here)
        self._cond = threading.Condition()
        self._in_flight = 0
        self._finishing: queue.Queue = queue.Queue()
        self.dropped = 0
        self.error: BaseException | None = None
        self._closed = False
        self._prepare_thread = threading.Thread(target=self._prepare_loop, daemon=True)
        self._finish_thread = threading.Thread(target=self._finish_loop, daemon=True)
        self._prepare_thread.start()
        self._finish_thread.start()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def submit(self, rgb: np.ndarray, t: float, tag=None) -> None:
        """Hand in the next frame (``tag`` comes back in ``info["tag"]``). Offline, StreamBusy
        when ``max_in_flight`` frames are already in; live, the oldest waiting frame is dropped
        instead."""
        received = time.perf_counter()
        with self._cond:
            if self._closed:
                raise InvalidInput(FRAME_FIELD, "the stream has ended")
            index = self._next_index = getattr(self, "_next_index", -1) + 1
            if self._in_flight >= self.limit:
                if not self.live:
                    self._next_index -= 1
                    raise StreamBusy(self.limit)
                self.dropped += 1
                pending = [i for i, item in enumerate(self._waiting) if item[0] == "frame"]
                if not pending:  # every slot is being worked on: this frame is the one dropped
                    self._waiting.append(("dropped", index, tag))
                    self._cond.notify_all()
                    return
                # the oldest frame not started is dropped; it is answered in its turn
                oldest = self._waiting[pending[0]]
                self._waiting[pending[0]] = ("dropped", oldest[4], oldest[5])
                self._in_flight -= 1
            self._waiting.append(("frame", rgb, t, received, index, tag))
            self._in_flight += 1
            self._cond.notify_all()

    def _prepare_loop(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._closed:
                    self._cond.wait()
                if not self._waiting:
                    self._finishing.put(_STOP)
                    return
                item = self._waiting.pop(0)
            if item[0] == "dropped":
                self._finishing.put(item)
                continue
            _, rgb, t, received, index, tag = item
            try:
                work = self.session.prepare(rgb, t, received)
                work.index = index
                self.session.schedule(work, self.pool)
                self._finishing.put(("work", work, tag))
            except Exception as exc:  # one frame's failure is that frame's answer
                self._finishing.put(("error", index, tag, exc))

    def _finish_loop(self) -> None:
        while True:
            item = self._finishing.get()
            if item is _STOP:
                return
            try:
                if item[0] == "work":
                    work, tag = item[1], item[2]
                    result = self.session.finish(work, wait=not self.live)
                    result.index = work.index
                elif item[0] == "dropped":
                    result = FrameResult(item[1], None, {"frame": item[1], "dropped": True})
                    tag = item[2]
                else:
                    index, tag, exc = item[1], item[2], item[3]
                    result = FrameResult(index, None, {"frame": index, "error": exc})
            except Exception as exc:  # a failed paste or diffusion: that frame's answer
                index = item[1].index if item[0] == "work" else item[1]
                result = FrameResult(index, None, {"frame": index, "error": exc})
            result.info["tag"] = tag
            with self._cond:
                if item[0] != "dropped":
                    self._in_flight -= 1
                self._cond.notify_all()
            try:
                self.emit(result)
            except Exception as exc:  # the receiver is gone: keep draining, remember why
                self.error = exc

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until every submitted frame has been answered."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._in_flight:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout: float | None = 60.0) -> None:
        """Finish the frames already submitted, then stop the threads."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._prepare_thread.join(timeout)
        self._finish_thread.join(timeout)


__all__ = [
    "FrameResult",
    "NoFaceFound",
    "StreamBusy",
    "StreamRunner",
    "StreamSession",
    "StreamSettings",
]
