"""The Q/K norm and rotary embedding (RoPE) of attention as one module: :class:`QKNormRotary`,
exported as one ``RMSNormRotary``, ``LayerNormRotary`` or ``L2NormRotary`` node of Q and K.

:func:`norm_rotary` runs the op with the weights and attributes of two onnxnorm norm modules
(Q's and K's), so that model code that keeps its ``q_norm`` and ``k_norm`` where they are (the
reference decoder's attention, for one) normalizes and rotates through it.
"""

from __future__ import annotations

from typing import Any

import torch

from onnxnorm.nn.functional import call
from onnxnorm.nn.modules import L2Norm, LayerNorm, RMSNorm

#: the kinds of norm, and the rotary op of each
OPS = {"rms": "RMSNormRotary", "layer": "LayerNormRotary", "l2": "L2NormRotary"}
#: layout names and their ``layout`` attribute
LAYOUTS = {"bshd": 0, "bhsd": 1, "bshd_to_bhsd": 2}


def _check_input(x: Any, role: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"norm_rotary expects a torch.Tensor {role}, got {type(x).__name__}")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"norm_rotary expects float32, float16 or bfloat16 {role}, got {x.dtype}")


def _kind(norm: torch.nn.Module) -> str:
    if isinstance(norm, RMSNorm):
        return "rms"
    if isinstance(norm, LayerNorm):
        return "layer"
    if isinstance(norm, L2Norm):
        return "l2"
    raise TypeError(
        f"norm_rotary takes onnxnorm RMSNorm, LayerNorm or L2Norm modules, got "
        f"{type(norm).__name__}"
    )


def _norm_attributes(norm: torch.nn.Module, kind: str, dtype: torch.dtype) -> dict[str, Any]:
    if kind == "l2":
        return {"epsilon": norm.eps}
    attrs = {"epsilon": norm.epsilon(dtype), "cast_before_scale": norm.cast_before_scale}
    if kind == "rms":
        attrs["scale_offset"] = norm.scale_offset
    return attrs


def _weight(value: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A weight as the op takes it: of the input's type or float32."""
    if value is None or value.dtype in (dtype, torch.float32):
        return value
    return value.float()


def norm_rotary(
    q_norm: torch.nn.Module,
    k_norm: torch.nn.Module | None,
    q: torch.Tensor,
    k: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    *,
    head_size: int = 0,
    layout: int = 0,
    per_head: bool = True,
    rotary_dim: int = 0,
    interleaved: bool = False,
    rotary_first: bool = False,
    rotary_in_t: bool = True,
) -> Any:
    """Q (and K) normalized by the onnxnorm norm modules ``q_norm`` (and ``k_norm``) and
    rotated by ``cos`` and ``sin``: one rotary op (``catalogue.ROTARY_OPS``) with the norms'
    weights, epsilon, offset and rounding order, and the rotary attributes given (the op's;
    ``head_size`` for 3-D Q and K). The two norms must agree in kind and attributes. Returns
    (QOut, KOut), or QOut where ``k`` is None."""
    kind = _kind(q_norm)
    _check_input(q, "q")
    attrs = _norm_attributes(q_norm, kind, q.dtype)
    if k is not None:
        if k_norm is None:
            raise ValueError("norm_rotary: k is given without k_norm")
        _check_input(k, "k")
        k_kind = _kind(k_norm)
        k_attrs = _norm_attributes(k_norm, k_kind, k.dtype)
        if k_kind != kind or k_attrs != attrs:
            raise ValueError(
                f"norm_rotary: Q's and K's norms differ ({kind} {attrs}, {k_kind} {k_attrs}): "
                "one rotary node takes one norm for both"
            )
    if position_ids is not None and position_ids.dtype != torch.int64:
        position_ids = position_ids.long()
    if cos.dtype not in (q.dtype, torch.float32):
        cos, sin = cos.float(), sin.float()
    attrs.update(
        head_size=int(head_size),
        layout=int(layout),
        per_head=int(per_head),
        rotary_dim=int(rotary_dim),
        interleaved=int(interleaved),
        rotary_first=int(rotary_first),
        rotary_in_t=int(rotary_in_t),
    )
    norms = (q_norm, k_norm if k is not None else None)
    weights: list[torch.Tensor | None] = []
    if kind != "l2":
        weights += [_weight(getattr(n, "weight", None), q.dtype) if n else None for n in norms]
    if kind == "layer":
        weights += [_weight(getattr(n, "bias", None), q.dtype) if n else None for n in norms]
    if kind != "l2" and len({w.dtype for w in weights if w is not None}) > 1:
        weights = [w.float() if w is not None else None for w in weights]
    return call(OPS[kind], q, k, *weights, cos, sin, position_ids, **attrs)


class QKNormRotary(torch.nn.Module):
    """The Q/K norm and rotary embedding of an attention layer in one call, exported as one
    ``RMSNormRotary``, ``LayerNormRotary`` or ``L2NormRotary`` node (with Q and K, or Q alone).

    ``forward(q, k, cos, sin, position_ids=None)`` returns ``(q, k)`` normalized and rotated,
    or q alone where ``k`` is None. The norms are the submodules ``q_norm`` and ``k_norm``
    (onnxnorm :class:`RMSNorm`, :class:`LayerNorm` or :class:`L2Norm`), so the state dict holds
    ``q_norm.weight`` and ``k_norm.weight`` (and ``q_norm.bias``, ``k_norm.bias``), the names
    of a Hugging Face attention layer's Q/K norms: ``module.load_state_dict(...)`` takes those
    entries of a checkpoint as they are.

    * ``kind``: ``"rms"`` (Qwen3, Gemma 3, OLMo 2, Llama 4 without weight), ``"layer"``
      (Cohere, StableLM, Phi, Chameleon) or ``"l2"`` (the root of the sum of squares, no
      weight).
    * ``head_dim``, ``q_heads``, ``k_heads`` (None: as many as Q; 0: no K, forward takes Q
      alone).
    * ``weight``: ``"head"`` (one head's weight ``[head_dim]`` shared by the heads: Qwen3,
      Gemma 3), ``"heads"`` (a weight per head, ``[heads, head_dim]``: Cohere, StableLM; or
      ``[heads * head_dim]`` over the whole token with ``per_head=False``: OLMo 2) or None (no
      weight: Llama 4, L2). ``bias``: LayerNorm's bias, shaped as the weight.
    * ``per_head``: True normalizes each head; False each token's heads together (OLMo 2).
    * ``eps``, ``scale_offset`` (RMSNorm's ``1 + weight``: Gemma 3, Qwen3-Next; the weight
      starts at 0), ``cast_before_scale`` (rounding order: 1 order A, Qwen3; 0 order B).
    * ``rotary_dim``: the leading values of each head that are rotated (None: all);
      ``interleaved``: pairs (2j, 2j + 1) rather than the halves; ``rotary_first``: rotate,
      then normalize (Llama 4); ``rotary_in_t``: True rounds each step of the rotation to the
      input's type as eager PyTorch does, False computes it in float32 and rounds once (OLMo
      2, Cohere, Llama 4).
    * ``layout``: ``"bshd"`` (q and k ``[batch, seq, heads, head_dim]`` or ``[batch, seq,
      heads * head_dim]``, the outputs alike), ``"bhsd"`` (``[batch, heads, seq, head_dim]``)
      or ``"bshd_to_bhsd"`` (``[batch, seq, ...]`` in, ``[batch, heads, seq, head_dim]`` out:
      the transpose models write between their norm and their rotary).

    ``cos`` and ``sin`` are per token, ``[batch or 1, seq, rotary_dim]`` (what Hugging Face's
    rotary embeddings compute) or ``[batch or 1, seq, rotary_dim / 2]``, or with
    ``position_ids`` ``[max_position, rotary_dim or rotary_dim / 2]`` caches, of q's type or
    float32.
    """

    def __init__(
        self,
        kind: str,
        head_dim: int,
        q_heads: int,
        k_heads: int | None = None,
        *,
        weight: str | None = "head",
        bias: bool = False,
        per_head: bool = True,
        eps: float = 1e-6,
        scale_offset: float = 0.0,
        cast_before_scale: int = 0,
        rotary_dim: int | None = None,
        interleaved: bool = False,
        rotary_first: bool = False,
        rotary_in_t: bool = True,
        layout: str = "bshd",
        device=None,
        dtype=None,
    ):
        super().__init__()
        if kind not in OPS:
            raise ValueError(f"kind must be one of {tuple(OPS)}, got {kind!r}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {tuple(LAYOUTS)}, got {layout!r}")
        if weight not in ("head", "heads", None):
            raise ValueError(f"weight must be 'head', 'heads' or None, got {weight!r}")
        if kind == "l2" and (weight is not None or bias):
            raise ValueError("the L2 norm has no weight or bias: weight=None")
        if bias and (kind != "layer" or weight is None):
            raise ValueError("bias is for LayerNorm with a weight")
        if scale_offset and kind != "rms":
            raise ValueError("scale_offset is for RMSNorm only")
        if not per_head and layout == "bhsd":
            raise ValueError("per_head=False normalizes a token's heads together: not bhsd")
        rotary = head_dim if rotary_dim is None else int(rotary_dim)
        if head_dim < 1 or rotary % 2 or not 0 < rotary <= head_dim:
            raise ValueError(
                f"rotary_dim must be even and in (0, head_dim = {head_dim}], got {rotary_dim}"
            )
        self.kind, self.head_dim = kind, int(head_dim)
        self.q_heads = int(q_heads)
        self.k_heads = self.q_heads if k_heads is None else int(k_heads)
        self.weight_shape, self.per_head = weight, bool(per_head)
        self.rotary_dim = 0 if rotary == head_dim else rotary
        self.interleaved, self.rotary_first = bool(interleaved), bool(rotary_first)
        self.rotary_in_t, self.layout = bool(rotary_in_t), layout
        factory = dict(device=device, dtype=dtype)

        def norm(heads: int) -> torch.nn.Module:
            if kind == "l2":
                return L2Norm(eps)
            shape: Any = None
            if weight == "head":
                shape = (self.head_dim,)
            elif weight == "heads":
                shape = (heads, self.head_dim) if per_head else (heads * self.head_dim,)
            if kind == "rms":
                return RMSNorm(
                    shape,
                    eps,
                    weight is not None,
                    scale_offset=scale_offset,
                    cast_before_scale=cast_before_scale,
                    axis=-1,
                    **factory,
                )
            return LayerNorm(
                shape,
                eps,
                weight is not None,
                bias,
                cast_before_scale=cast_before_scale,
                axis=-1,
                **factory,
            )

        self.q_norm = norm(self.q_heads)
        self.k_norm = norm(self.k_heads) if self.k_heads else None

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        position_ids: torch.Tensor | None = None,
    ) -> Any:
        if k is not None and self.k_norm is None:
            raise ValueError("QKNormRotary built with k_heads=0 takes no k")
        for name, x, heads in (("q", q, self.q_heads), ("k", k, self.k_heads)):
            if x is None:
                continue
            dims = tuple(x.shape)
            if x.dim() == 3:
                ok = dims[2] == heads * self.head_dim and self.layout != "bhsd"
            elif x.dim() == 4:
                axis = 1 if self.layout == "bhsd" else 2
                ok = dims[axis] == heads and dims[3] == self.head_dim
            else:
                ok = False
            if not ok:
                raise ValueError(
                    f"QKNormRotary ({heads} heads of {self.head_dim}, layout {self.layout}) "
                    f"got {name} of shape {dims}"
                )
        return norm_rotary(
            self.q_norm,
            self.k_norm,
            q,
            k,
            cos,
            sin,
            position_ids,
            head_size=self.head_dim if q.dim() == 3 else 0,
            layout=LAYOUTS[self.layout],
            per_head=self.per_head,
            rotary_dim=self.rotary_dim,
            interleaved=self.interleaved,
            rotary_first=self.rotary_first,
            rotary_in_t=self.rotary_in_t,
        )

    def extra_repr(self) -> str:
        text = f"{self.kind!r}, head_dim={self.head_dim}, q_heads={self.q_heads}"
        text += f", k_heads={self.k_heads}, layout={self.layout!r}"
        if not self.per_head:
            text += ", per_head=False"
        if self.rotary_dim:
            text += f", rotary_dim={self.rotary_dim}"
        if self.interleaved:
            text += ", interleaved=True"
        if self.rotary_first:
            text += ", rotary_first=True"
        return text + f", rotary_in_t={self.rotary_in_t}"
