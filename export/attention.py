"""Fuse the UNet's attention into ONNX Runtime's ``MultiHeadAttention`` for CPU serving.

``torch.onnx.export`` writes each attention of a diffusers UNet as MatMul, Mul, Softmax and
MatMul over a materialised [B, heads, S, S] score tensor. At the 32x32 latent level (1024
tokens) those ops were 75% of the tiny UNet's time and 35% of the mid one's on ORT CPU, more
than its convolutions. ORT's ``MultiHeadAttention`` contrib kernel computes the same function
in one node (1.4x faster than the unfused ops on one 1024-token self-attention, 1 thread).

ORT's transformer optimizer (``onnxruntime.transformers.optimizer``, ``model_type="unet"``)
finds the attentions. For the CPU it has one gap: it fuses a self-attention into either an
``Attention`` node with packed QKV weights (whose CPU kernel materialises the scores like the
unfused graph) or a packed-QKV ``MultiHeadAttention`` that the CPU kernel refuses. So
:func:`fuse_attention` runs the optimizer with its GPU-only fusions off, then rewrites each
``Attention`` node as three MatMuls (Q, K and V projections, as exported) feeding a
``MultiHeadAttention`` with separate Q, K and V: the only hand-written part.

Invariant: the fused graph computes the same function as its source, up to fp32 rounding
(max abs ~1.5e-6 on the tiny and mid UNets). :func:`fusion_error` measures it on random inputs;
``facefuse export`` checks it on every UNet it fuses (:func:`facefuse.export.quantize.fused_int8`).
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from facefuse.core.contract import ENCODER_HIDDEN_STATES, SAMPLE, TIMESTEP
from facefuse.runtime.sessions import open_session

# The optimizer's fusions whose kernels exist only for CUDA/ROCm (NHWC convs, GroupNorm,
# BiasSplitGelu, packed QKV/KV layouts, BiasAdd): off for a CPU graph.
GPU_ONLY_FUSIONS = (
    "enable_nhwc_conv",
    "enable_group_norm",
    "enable_skip_group_norm",
    "enable_bias_splitgelu",
    "enable_packed_qkv",
    "enable_packed_kv",
    "enable_bias_add",
)


@dataclass(frozen=True)
class AttentionFusion:
    """What :func:`fuse_attention` did: fused node counts and the rewritten self-attentions."""

    fused: dict[str, int]
    self_attention_rewritten: int


def cpu_fusion_options():
    """``FusionOptions("unet")`` with :data:`GPU_ONLY_FUSIONS` off."""
    from onnxruntime.transformers.fusion_options import FusionOptions

    options = FusionOptions("unet")
    for name in GPU_ONLY_FUSIONS:
        if hasattr(options, name):
            setattr(options, name, False)
    return options


def _attention_to_mha(graph) -> int:
    """Rewrite every ``Attention(x, W[C, 3C], b[3C])`` node as Q/K/V MatMuls and a
    ``MultiHeadAttention(q, k, v, b)``; returns how many were rewritten."""
    from onnx import helper, numpy_helper

    initializers = {tensor.name: tensor for tensor in graph.initializer}
    rewritten = 0
    nodes = []
    for node in graph.node:
        if node.op_type != "Attention" or node.domain != "com.microsoft" or len(node.input) != 3:
            nodes.append(node)
            continue
        x, weight_name, bias_name = node.input
        weight = numpy_helper.to_array(initializers[weight_name])
        width = weight.shape[1] // 3
        projected = []
        for index, part in enumerate("qkv"):
            name = f"{node.name}_{part}"
            graph.initializer.append(
                numpy_helper.from_array(
                    np.ascontiguousarray(weight[:, index * width : (index + 1) * width]),
                    f"{name}_weight",
                )
            )
            nodes.append(
                helper.make_node("MatMul", [x, f"{name}_weight"], [f"{name}_out"], name=name)
            )
            projected.append(f"{name}_out")
        heads = next(a.i for a in node.attribute if a.name == "num_heads")
        nodes.append(
            helper.make_node(
                "MultiHeadAttention",
                [*projected, bias_name],
                list(node.output),
                name=f"{node.name}_mha",
                domain="com.microsoft",
                num_heads=heads,
            )
        )
        graph.initializer.remove(initializers[weight_name])
        rewritten += 1
    del graph.node[:]
    graph.node.extend(nodes)
    return rewritten


def fuse_attention(source: str | Path, destination: str | Path) -> AttentionFusion:
    """Write ``source`` (an exported UNet) with its attentions fused for the CPU to
    ``destination``; external data is kept when the model is large."""
    from facefuse.export.quantize import EXTERNAL_DATA_LIMIT, model_bytes, save_model
    from onnx import helper
    from onnxruntime.transformers.optimizer import optimize_model

    source, destination = Path(source), Path(destination)
    with contextlib.redirect_stderr(io.StringIO()):  # the optimizer's tqdm progress bar
        optimized = optimize_model(
            str(source),
            model_type="unet",
            opt_level=0,  # the session applies ORT's own graph optimisations at load
            optimization_options=cpu_fusion_options(),
            use_gpu=False,
        )
    fused = {k: int(v) for k, v in optimized.get_fused_operator_statistics().items() if v}
    rewritten = _attention_to_mha(optimized.model.graph)
    if not any(o.domain == "com.microsoft" for o in optimized.model.opset_import):
        optimized.model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    save_model(optimized.model, destination, large=model_bytes(source) > EXTERNAL_DATA_LIMIT)
    return AttentionFusion(fused, rewritten)


def fusion_error(
    source: str | Path, fused: str | Path, latent: int = 16, seed: int = 0
) -> tuple[float, float]:
    """(max abs difference, max abs output) of ``fused`` against ``source`` on one random
    UNet call of batch 2 at a ``latent`` x ``latent`` latent (``unet_shallow``'s ``deep``
    input too)."""

    outputs = []
    for path in (source, fused):
        session = open_session(path)
        channels = session.get_inputs()[0].shape[1]  # 4 for SD 1.x, 32 for TAEF2 latents
        hidden = session.get_inputs()[2].shape[2]
        rng = np.random.default_rng(seed)
        feeds = {
            SAMPLE.name: rng.standard_normal((2, channels, latent, latent)).astype(np.float32),
            TIMESTEP.name: np.array([500.0, 20.0], dtype=np.float32),
            ENCODER_HIDDEN_STATES.name: rng.standard_normal((2, 77, hidden)).astype(np.float32),
        }
        for extra in session.get_inputs()[3:]:  # DEEP: [batch, channels, latent, latent]
            shape = (2, extra.shape[1], latent, latent)
            feeds[extra.name] = rng.standard_normal(shape).astype(np.float32)
        outputs.append(session.run(None, feeds)[0])
        del session
    reference, candidate = outputs
    return float(np.abs(candidate - reference).max()), float(np.abs(reference).max())
