"""The ``facefusion_stream`` Triton model: video and camera streams, one per correlation id.

A decoupled Python model (runs inside a stub only). ``execute`` answers each request through
its own response sender and returns at once: a START (``sequence_start``, with A and the
options) opens a :class:`~facefuse.diffusion.stream.StreamSession` over the same BLS stages as
``facefusion``; each frame (FRAME raw, or FRAME_JPEG) goes to that stream's
:class:`~facefuse.diffusion.stream.StreamRunner` and is answered, in order, in the form it came
in; END (``sequence_end``) frees the stream after its frames. The bounds and the rules for when
a stream dies are :mod:`facefuse.serving.streams`'.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import cv2
import numpy as np

from facefuse.core import contract as c
from facefuse.core import metrics
from facefuse.core.errors import InvalidInput, ModelLoadError
from facefuse.core.limits import check_fusion_instruction
from facefuse.diffusion.stream import FrameResult, StreamRunner, StreamSession, StreamSettings
from facefuse.serving.streams import StreamLimits, StreamRegistry
from facefuse.serving.triton_io import (
    TritonMetric,
    error_response,
    get_array,
    get_bytes,
    get_scalar,
    get_text,
    pb_utils,
    text_tensor,
)
from facefuse.serving.triton_pipeline import PipelineTritonModel

START, END = 1, 2


def _expression(request) -> dict:
    """The stream's expression fields (the still model's reading of them)."""
    from facefuse.core.contract import check_expression_inputs

    source = get_text(request, c.EXPRESSION_SOURCE.name, required=False)
    source = source.strip().lower() if source is not None else None

    def number(name):
        def cast(value):
            try:
                return float(value)
            except (TypeError, ValueError, OverflowError):
                raise InvalidInput(name, f"must be a number, got {value!r}") from None

        return cast

    smile = get_scalar(request, c.EXPRESSION_SMILE.name, None, number(c.EXPRESSION_SMILE.name))
    mouth = get_scalar(
        request, c.EXPRESSION_MOUTH_OPEN.name, None, number(c.EXPRESSION_MOUTH_OPEN.name)
    )
    check_expression_inputs(source, smile, mouth)
    fields = {"source": source, "smile": smile, "mouth_open": mouth}
    return {k: v for k, v in fields.items() if v is not None}


class StreamTritonModel(PipelineTritonModel):
    """See the module docstring."""

    def initialize(self, args: dict) -> None:
        super().initialize(args)
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        try:
            self.limits = StreamLimits.from_parameters(params)
            self.refine_every = int(params.get("refine_every", "12"))
            threads = int(params.get("diffusion_threads", "2"))
            self.jpeg_quality = int(params.get("jpeg_quality", "90"))
            StreamSettings(refine_every=self.refine_every)
            if not 1 <= threads <= 64 or not 1 <= self.jpeg_quality <= 100:
                raise ValueError("diffusion_threads must be 1..64 and jpeg_quality 1..100")
        except (ValueError, InvalidInput) as exc:
            raise ModelLoadError(f"{self.name}: {exc}") from None
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="facefuse-stream-diffuse")
        self.streams_metric = TritonMetric(
            metrics.STREAMS_OPEN, "open facefusion streams", kind="gauge", model=self.name
        )
        self.streams_metric.set(0)  # exported from load on: the autoscaler reads it before use
        self.frames_metric = TritonMetric(
            metrics.STREAM_FRAMES, "stream frames by outcome (ok, dropped, error)"
        )
        self.closed_metric = TritonMetric(
            metrics.STREAMS_CLOSED, "closed streams by reason (ended, idle, cancelled, ...)"
        )
        self.registry = StreamRegistry(self.limits, on_close=self._closed)
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap, daemon=True, name="facefuse-reaper")
        self._reaper.start()

    def _closed(self, stream, reason: str) -> None:
        self.closed_metric.increment(1, model=self.name, reason=reason)
        self.streams_metric.set(len(self.registry), model=self.name)

    def _reap(self) -> None:
        period = min(1.0, self.limits.idle_timeout_s / 4)
        while not self._stop.wait(period):
            self.registry.expire()

    # -- one request ---------------------------------------------------------------------

    def _open(self, request, key):
        """A START: the stream's session (A analysed, the instruction encoded) and runner."""
        from facefuse.face.imageio import decode_image

        source = get_bytes(request, c.SOURCE_IMAGE.name, required=False)
        if source is None:
            raise InvalidInput(c.SOURCE_IMAGE.name, "is required at the stream's start")
        instruction = check_fusion_instruction(
            get_text(request, c.INSTRUCTION.name, required=False)
        )
        select = (get_text(request, c.FACE_SELECT.name, required=False) or "largest").lower()
        if select not in ("largest", "all"):
            raise InvalidInput(c.FACE_SELECT.name, f"must be largest or all, got {select!r}")
        live = bool(get_scalar(request, c.LIVE.name, False, bool))
        settings = StreamSettings(
            refine_every=self.refine_every,
            max_in_flight=self.limits.max_in_flight,
            live=live,
            select=select,
        )
        params = self.params(request)
        source_rgb = decode_image(source, c.SOURCE_IMAGE.name)
        session = StreamSession(
            self.pipeline, source_rgb, instruction, params, _expression(request), settings
        )

        def emit(result: FrameResult) -> None:
            self._send_frame(key, result)

        return StreamRunner(session, emit, self.pool)

    def _frame(self, request, stream) -> tuple[np.ndarray | None, str]:
        """(the request's frame as RGB uint8 or None, its form: "raw" or "jpeg")."""
        from facefuse.face.imageio import decode_image

        raw = get_array(request, c.FRAME.name)
        if raw is not None:
            stream.check_frame(raw.shape, self.limits, c.FRAME.name)
            return np.ascontiguousarray(raw, dtype=np.uint8), "raw"
        jpeg = get_bytes(request, c.FRAME_JPEG.name, required=False)
        if jpeg is None:
            return None, "raw"
        rgb = decode_image(jpeg, c.FRAME_JPEG.name)
        stream.check_frame(rgb.shape, self.limits, c.FRAME_JPEG.name)
        return rgb, "jpeg"

    def _send_frame(self, key, result: FrameResult) -> None:
        pb = pb_utils()
        sender, form = result.info.pop("tag")
        error = result.info.pop("error", None)
        outcome = "dropped" if result.info.get("dropped") else "ok"
        if error is not None:
            response, outcome = error_response(error, self.name), "error"
        else:
            tensors = [text_tensor(c.INFO.name, json.dumps(result.info, sort_keys=True))]
            if result.rgb is not None and form == "raw":
                tensors.append(pb.Tensor(c.FRAME.name, np.ascontiguousarray(result.rgb)))
            elif result.rgb is not None:
                bgr = cv2.cvtColor(result.rgb, cv2.COLOR_RGB2BGR)
                _, data = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, self.jpeg_quality])
                array = np.array([data.tobytes()], dtype=np.object_)
                tensors.append(pb.Tensor(c.FRAME_JPEG.name, array))
            response = pb.InferenceResponse(output_tensors=tensors)
        self.frames_metric.increment(1, model=self.name, outcome=outcome)
        if sender.is_cancelled():  # the client is gone: free the stream (not on this thread,
            # which is the runner's own and must drain)
            threading.Thread(target=self.registry.cancel, args=(key,), daemon=True).start()
            return
        sender.send(response, flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _handle(self, request) -> None:
        pb = pb_utils()
        sender = request.get_response_sender()
        try:
            key, flags = request.correlation_id(), request.flags()
            if key in (0, ""):
                raise InvalidInput("sequence_id", "must be set: one id per stream")
            info: dict = {}
            if flags & START:
                stream = self.registry.start(key, lambda: self._open(request, key))
                self.streams_metric.set(len(self.registry), model=self.name)
                session = stream.runner.session
                info.update(
                    started=True,
                    setup_ms=session.setup_ms,
                    refine_every=session.settings.refine_every,
                    live=session.settings.live,
                    prompt=session.prompt_info.get("prompt"),
                    asked=session.prompt_info.get("asked", "nothing"),
                )
            stream = self.registry.get(key)
            frame, form = self._frame(request, stream)
            if frame is not None:
                time_s = get_scalar(request, c.FRAME_TIME.name, None, float)
                if time_s is None:
                    time_s = stream.frames / 25.0
                stream.frames += 1
                stream.runner.submit(frame, float(time_s), tag=(sender, form))
            if flags & END:
                self.registry.end_after_frames(key)
                info["ending"] = True
            if frame is None:  # a control request: answered now
                info["stream"] = str(key)
                response = pb.InferenceResponse(
                    output_tensors=[text_tensor(c.INFO.name, json.dumps(info, sort_keys=True))]
                )
                sender.send(response, flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as exc:  # the boundary: this request's answer, the stream goes on
            outcome = "invalid" if isinstance(exc, InvalidInput) else "error"
            self.frames_metric.increment(1, model=self.name, outcome=outcome)
            sender.send(
                error_response(exc, self.name), flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            )

    def execute(self, requests):
        for request in requests:
            self._handle(request)
        return None

    def finalize(self) -> None:
        self._stop.set()
        self.registry.close_all()
        self.pool.shutdown(wait=False, cancel_futures=True)
