"""facefusion_stream: video and camera streams (logic: facefuse.serving.triton_stream)."""

from facefuse.serving.triton_stream import StreamTritonModel


class TritonPythonModel(StreamTritonModel):
    pass
