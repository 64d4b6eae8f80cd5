"""Incremental (prefix-KV) CLIP text encoder: a torch module over the model's own weights, and
its ONNX export in two graphs that the serving cache runs with ONNX Runtime.

Why this is exact: CLIP's text transformer is causal. The hidden state and the keys/values of
every layer at position ``i`` depend only on tokens ``0..i``. So for a prompt whose first ``P``
tokens were seen before, the keys/values of positions ``0..P-1`` can be taken from a cache and
only positions ``P..76`` (the rest of the prompt *and* the padding, which depend on the whole
prompt) computed, attending to the cached keys/values with CLIP's causal mask shifted by ``P``.

Graphs (both with dynamic batch ``B``; ``L`` layers, ``D`` hidden size):

``text_encoder_kv_prefix.onnx``
    ``input_ids`` int64 [B, P] -> ``kv`` fp32 [B, L, 2, P, D] (keys then values of each layer, heads
    merged), ``hidden`` fp32 [B, P, D] (final layer norm applied to the output of layer
    ``L - clip_skip``: the diffusers ``clip_skip`` convention), and, when ``clip_skip > 0``,
    ``final_hidden`` fp32 [B, P, D] (final layer norm of the last layer, where the pooled output
    is read).
``text_encoder_kv_suffix.onnx``
    ``input_ids`` int64 [B, S] (the tokens at positions P..P+S-1) and ``past_kv`` fp32
    [B, L, 2, P, D] -> the same outputs for positions P..P+S-1 only; the offset ``P`` is read
    from ``past_kv``'s shape.

``text_encoder_kv.json`` (the manifest) records the sizes, the clip_skip baked into the graphs, the
pooled-output rule, and a model identity (sha256 of the suffix graph) that the cache puts in its
key. torch is imported here and in the benchmark only; serving needs numpy + onnxruntime.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

from facefuse.cache.encoder import pooled_index
from facefuse.cache.runtime import (
    KV_MANIFEST_FILE,
    KV_PREFIX_FILE,
    KV_SUFFIX_FILE,
    MANIFEST_FORMAT,
)

# Bound on |ONNX incremental - PyTorch full forward| in fp32 (the cache's exactness promise).
EXACT_TOLERANCE = 1e-5
OPSET = 17


class KvExportError(RuntimeError):
    """The exported KV graphs do not reproduce the PyTorch full forward within the bound."""


def _text_model(text_encoder):
    """transformers 5 puts the tower on ``CLIPTextModel`` itself; 4.x under ``.text_model``."""
    return getattr(text_encoder, "text_model", text_encoder)


def pooled_rule(text_encoder) -> str:
    """``"argmax"`` for legacy configs with ``eos_token_id == 2`` (transformers then pools at the
    highest token id, as real SD 1.5 / 2.x checkpoints do), otherwise ``"first_eos"``."""
    return "argmax" if int(text_encoder.config.eos_token_id) == 2 else "first_eos"


class IncrementalCLIPText(nn.Module):
    """CLIP's text transformer run on positions ``P..P+S-1`` given the keys/values of ``0..P-1``.

    Every weight is the wrapped ``CLIPTextModel``'s own module (embeddings, each layer's
    layer norms, q/k/v/out projections and MLP, the final layer norm), so any activation or
    checkpoint that transformers loads is honoured.

    ``forward(input_ids [B, S], past_kv [B, L, 2, P, D] | None)`` returns
    ``(kv [B, L, 2, S, D], hidden [B, S, D], final_hidden [B, S, D])`` for the new positions.
    With ``past_kv=None`` it is the full causal forward of the ``S`` tokens from position 0.
    """

    def __init__(self, text_encoder, clip_skip: int = 0, fuse_qkv: bool = False):
        super().__init__()
        tower = _text_model(text_encoder)
        config = text_encoder.config
        self.layers = tower.encoder.layers
        num_layers = len(self.layers)
        if not (0 <= clip_skip < num_layers):
            raise ValueError(f"clip_skip must be in 0..{num_layers - 1}, got {clip_skip}")
        self.token_embedding = tower.embeddings.token_embedding
        self.position_embedding = tower.embeddings.position_embedding
        self.final_layer_norm = tower.final_layer_norm
        self.num_heads = int(config.num_attention_heads)
        self.hidden_size = int(config.hidden_size)
        self.head_dim = self.hidden_size // self.num_heads
        self.scale = float(self.layers[0].self_attn.scale)
        self.clip_skip = int(clip_skip)
        self.selected_layer = num_layers - self.clip_skip  # 1-based: output of this layer
        # One [3D, D] projection instead of q, k, v: the same dot products, one GEMM (fewer,
        # larger kernels matter most for the short suffix runs). Weights are copies of the
        # model's own q/k/v projections, concatenated.
        self.fuse_qkv = fuse_qkv
        if fuse_qkv:
            self.qkv_weight = nn.ParameterList(
                nn.Parameter(
                    torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).detach(),
                    requires_grad=False,
                )
                for a in (layer.self_attn for layer in self.layers)
            )
            self.qkv_bias = nn.ParameterList(
                nn.Parameter(
                    torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]).detach(),
                    requires_grad=False,
                )
                for a in (layer.self_attn for layer in self.layers)
            )

    def _attend(self, index, layer, hidden, past_k, past_v, mask):
        attn = layer.self_attn
        if self.fuse_qkv:
            q, k, v = torch.nn.functional.linear(
                hidden, self.qkv_weight[index], self.qkv_bias[index]
            ).split(self.hidden_size, dim=-1)
        else:
            q, k, v = attn.q_proj(hidden), attn.k_proj(hidden), attn.v_proj(hidden)
        keys = k if past_k is None else torch.cat([past_k, k], dim=1)
        values = v if past_v is None else torch.cat([past_v, v], dim=1)
        heads = (self.num_heads, self.head_dim)
        qh = q.unflatten(-1, heads).transpose(1, 2)  # [B, H, S, dh]
        kh = keys.unflatten(-1, heads).transpose(1, 2)  # [B, H, P+S, dh]
        vh = values.unflatten(-1, heads).transpose(1, 2)
        weights = torch.matmul(qh, kh.transpose(-1, -2)) * self.scale + mask
        weights = torch.softmax(weights, dim=-1)
        out = torch.matmul(weights, vh).transpose(1, 2).flatten(2)  # [B, S, D]
        return attn.out_proj(out), k, v

    def forward(self, input_ids: torch.Tensor, past_kv: torch.Tensor | None = None):
        seq = input_ids.shape[1]
        past = 0 if past_kv is None else past_kv.shape[3]
        positions = torch.arange(seq, device=input_ids.device) + past  # absolute positions
        keys_at = torch.arange(seq + past, device=input_ids.device)
        # CLIP's causal mask, shifted: query at absolute position q sees keys 0..q.
        blocked = keys_at.unsqueeze(0) > positions.unsqueeze(1)  # [S, P+S]
        mask = blocked.to(torch.float32) * torch.finfo(torch.float32).min  # 0 or min, as CLIP
        hidden = self.token_embedding(input_ids) + self.position_embedding(positions)
        new_kv = []
        selected = hidden
        for index, layer in enumerate(self.layers):
            past_k = None if past_kv is None else past_kv[:, index, 0]
            past_v = None if past_kv is None else past_kv[:, index, 1]
            residual = hidden
            normed = layer.layer_norm1(hidden)
            attn_out, k, v = self._attend(index, layer, normed, past_k, past_v, mask)
            hidden = residual + attn_out
            hidden = hidden + layer.mlp(layer.layer_norm2(hidden))
            new_kv.append(torch.stack([k, v], dim=1))  # [B, 2, S, D]
            if index + 1 == self.selected_layer:
                selected = hidden
        kv = torch.stack(new_kv, dim=1)  # [B, L, 2, S, D]
        return kv, self.final_layer_norm(selected), self.final_layer_norm(hidden)


@torch.no_grad()
def reference_outputs(text_encoder, input_ids: np.ndarray, clip_skip: int = 0):
    """The PyTorch full forward: ``(hidden [B, 77, D], pooled [B, D])`` as numpy fp32.

    ``hidden`` is ``last_hidden_state`` for ``clip_skip == 0``; otherwise diffusers'
    ``final_layer_norm(hidden_states[-(clip_skip + 1)])``. ``pooled`` is ``pooler_output``.
    """
    ids = torch.from_numpy(np.asarray(input_ids, dtype=np.int64))
    out = text_encoder(input_ids=ids, output_hidden_states=clip_skip > 0, return_dict=True)
    hidden = out.last_hidden_state
    if clip_skip > 0:
        hidden = _text_model(text_encoder).final_layer_norm(out.hidden_states[-(clip_skip + 1)])
    return hidden.numpy(), out.pooler_output.numpy()


class _PrefixGraph(nn.Module):
    def __init__(self, core: IncrementalCLIPText, with_final: bool):
        super().__init__()
        self.core = core
        self.with_final = with_final

    def forward(self, input_ids):
        kv, hidden, final = self.core(input_ids)
        return (kv, hidden, final) if self.with_final else (kv, hidden)


class _SuffixGraph(_PrefixGraph):
    def forward(self, input_ids, past_kv):
        kv, hidden, final = self.core(input_ids, past_kv)
        return (kv, hidden, final) if self.with_final else (kv, hidden)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def check_ids(batch: int, seed: int, eos_token_id: int, vocab_size: int) -> np.ndarray:
    """Random prompts of varied lengths, half padded SD 1.x style (eos), half SD 2.x style (0)."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((batch, 77), dtype=np.int64)
    for row in range(batch):
        length = int(rng.integers(1, 75))  # content tokens
        ids[row, 0] = 49406 if vocab_size > 49406 else 0
        ids[row, 1 : 1 + length] = rng.integers(0, min(vocab_size, 49406), length)
        ids[row, 1 + length] = eos_token_id
        ids[row, 2 + length :] = eos_token_id if row % 2 == 0 else 0
    return ids


def _run_kv_graphs(prefix_sess, suffix_sess, ids: np.ndarray, split: int):
    """Prefix graph on ``ids[:, :split]`` then suffix graph on the rest; full 77 outputs."""
    pre = prefix_sess.run(None, {"input_ids": ids[:, :split]})
    suf = suffix_sess.run(None, {"input_ids": ids[:, split:], "past_kv": pre[0]})
    hidden = np.concatenate([pre[1], suf[1]], axis=1)
    final = np.concatenate([pre[-1], suf[-1]], axis=1)
    return hidden, final


def check_kv_graphs(
    text_encoder,
    prefix_path: Path,
    suffix_path: Path,
    clip_skip: int = 0,
    tolerance: float = EXACT_TOLERANCE,
    verbose: bool = False,
) -> float:
    """Max abs difference of prefix graph + suffix graph (split at P = 1, 16, 48, 76) to the
    PyTorch full forward on random prompts of both padding conventions (hidden and pooled).
    Raises :class:`KvExportError` above ``tolerance``."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    prefix_sess = ort.InferenceSession(str(prefix_path), options, ["CPUExecutionProvider"])
    suffix_sess = ort.InferenceSession(str(suffix_path), options, ["CPUExecutionProvider"])
    config = text_encoder.config
    eos = int(config.eos_token_id) if int(config.eos_token_id) != 2 else 49407
    check = check_ids(4, 1, eos, int(config.vocab_size))
    ref_hidden, ref_pooled = reference_outputs(text_encoder, check, clip_skip)
    index = pooled_index(check, pooled_rule(text_encoder), eos)
    worst = 0.0
    for split in (1, 16, 48, 76):
        hidden, final = _run_kv_graphs(prefix_sess, suffix_sess, check, split)
        pooled = final[np.arange(len(check)), index]
        diff = max(
            float(np.max(np.abs(hidden - ref_hidden))), float(np.max(np.abs(pooled - ref_pooled)))
        )
        worst = max(worst, diff)
        if verbose:
            print(f"text_encoder_kv: prefix {split:2d} + suffix {77 - split:2d}: {diff:.2e}")
    if worst > tolerance:
        raise KvExportError(
            f"text_encoder_kv: ONNX incremental vs PyTorch full forward differ by {worst:.3e} "
            f"(bound {tolerance:.0e})"
        )
    return worst


def export_kv_encoder(
    text_encoder,
    out_dir: str | Path,
    *,
    clip_skip: int = 0,
    verbose: bool = True,
    tolerance: float = EXACT_TOLERANCE,
) -> dict[str, Path]:
    """Export the prefix and suffix graphs + manifest into ``out_dir``; check them; return paths.

    The check runs random prompts (both padding conventions) through the prefix graph for a
    split point ``P`` and the suffix graph for the rest, for several ``P``, and compares hidden
    and pooled outputs with the PyTorch full forward. Raises :class:`KvExportError` when the max
    abs difference exceeds ``tolerance``. Returns ``{"prefix", "suffix", "manifest"}`` paths.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    text_encoder = text_encoder.eval()
    core = IncrementalCLIPText(text_encoder, clip_skip, fuse_qkv=True).eval()
    with_final = clip_skip > 0
    outputs = ["kv", "hidden", *(["final_hidden"] if with_final else [])]
    config = text_encoder.config
    eos = int(config.eos_token_id) if int(config.eos_token_id) != 2 else 49407
    vocab = int(config.vocab_size)
    layers, dim = len(core.layers), core.hidden_size

    ids = torch.from_numpy(check_ids(2, 0, eos, vocab))
    prefix_path, suffix_path = out / KV_PREFIX_FILE, out / KV_SUFFIX_FILE
    seq_axes = {0: "batch", 1: "seq"}
    kv_axes = {0: "batch", 3: "seq"}
    dyn = {"input_ids": seq_axes, "kv": kv_axes, "hidden": seq_axes, "final_hidden": seq_axes}
    with torch.no_grad():
        torch.onnx.export(
            _PrefixGraph(core, with_final),
            (ids[:, :23],),
            str(prefix_path),
            input_names=["input_ids"],
            output_names=outputs,
            dynamic_axes={k: v for k, v in dyn.items() if k in ("input_ids", *outputs)},
            opset_version=OPSET,
            dynamo=False,
        )
        past = core(ids[:, :23])[0]
        suffix_dyn = {k: v for k, v in dyn.items() if k in ("input_ids", *outputs)}
        suffix_dyn["past_kv"] = {0: "batch", 3: "past"}
        torch.onnx.export(
            _SuffixGraph(core, with_final),
            (ids[:, 23:], past),
            str(suffix_path),
            input_names=["input_ids", "past_kv"],
            output_names=outputs,
            dynamic_axes=suffix_dyn,
            opset_version=OPSET,
            dynamo=False,
        )

    worst = check_kv_graphs(text_encoder, prefix_path, suffix_path, clip_skip, tolerance, verbose)
    manifest = {
        "format": MANIFEST_FORMAT,
        "model_id": _sha256(suffix_path),
        "num_layers": layers,
        "hidden_size": dim,
        "num_heads": core.num_heads,
        "vocab_size": vocab,
        "max_length": int(config.max_position_embeddings),
        "clip_skip": clip_skip,
        "pooled_rule": pooled_rule(text_encoder),
        "eos_token_id": eos,
        "bos_token_id": 49406
        if int(config.bos_token_id) in (0, 49406)
        else int(config.bos_token_id),
        "outputs": outputs,
        "files": {
            "prefix": {"name": KV_PREFIX_FILE, "bytes": prefix_path.stat().st_size},
            "suffix": {"name": KV_SUFFIX_FILE, "bytes": suffix_path.stat().st_size},
        },
        "max_abs_diff": worst,
    }
    manifest_path = out / KV_MANIFEST_FILE
    manifest_path.write_text(json.dumps(manifest, indent=2))
    if verbose:
        print(f"text_encoder_kv: exported to {out} (max abs diff {worst:.2e} <= {tolerance:.0e})")
    return {"prefix": prefix_path, "suffix": suffix_path, "manifest": manifest_path}
