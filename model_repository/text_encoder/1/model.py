"""text_encoder: CLIP token ids -> conditioning (ONNX Runtime inside, batched)."""

import numpy as np

from facefuse.errors import InvalidInput
from facefuse.prompt.tokenizer import VOCAB_SIZE
from facefuse.triton_onnx import OnnxTritonModel


class TritonPythonModel(OnnxTritonModel):
    INPUTS = ("INPUT_IDS",)
    OUTPUTS = ("LAST_HIDDEN_STATE", "POOLED", "CACHE_HIT_TOKENS")

    def _inputs(self, request):
        ids = super()._inputs(request)["INPUT_IDS"]
        if ids.min() < 0 or ids.max() >= VOCAB_SIZE:
            raise InvalidInput("INPUT_IDS", f"token ids must be in 0..{VOCAB_SIZE - 1}")
        return {"input_ids": ids}

    def _forward(self, feeds):
        hidden, pooled = self.session.run(["last_hidden_state", "pooled"], feeds)
        return hidden, pooled, np.zeros((len(hidden), 1), dtype=np.int32)
