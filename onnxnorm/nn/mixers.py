"""The token mixers of the reference decoder (``decoder.py``): softmax attention with its Q/K
norms (:class:`Attention`), and the hybrids' linear-attention and state-space layers with their
gated and L2 norms where Qwen3-Next and Mamba2 put them (:class:`GatedDeltaNet`,
:class:`Mamba2Mixer`).

The linear-attention and state-space cores are simplified stand-ins (see their classes): the
norms sit where the real models put them, with the real shapes, but the recurrences are not the
models' own, so the outputs are not those of a Qwen3-Next or Mamba2 checkpoint.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from onnxnorm.nn.decoder_norms import make_gated_norm, make_l2_norm, make_norm
from onnxnorm.nn.families import DecoderConfig

#: RoPE's base (Llama's, Qwen's and most families')
ROPE_THETA = 10000.0


def rope_angles(
    seq: int, head_dim: int, dtype: torch.dtype, device: torch.device | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of positions 0 .. seq - 1 as Hugging Face's rotary embeddings compute them:
    one angle per value (the halves repeated), [1, seq, head_dim], in float32 then ``dtype``."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim
    inv_freq = 1.0 / (ROPE_THETA**exponent)
    positions = torch.arange(seq, dtype=torch.float32, device=device)
    freqs = positions[:, None] * inv_freq[None, :]
    angles = torch.cat([freqs, freqs], dim=-1)[None]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` ([batch, heads, seq, head_dim]; cos and sin
    [1, seq, head_dim] unsqueezed at the head axis), in x's type: rounded at each step where
    the angles are of x's type, in float32 and rounded once where they are float32 (OLMo 2)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return ((x * cos) + (rotate_half(x) * sin)).to(x.dtype)


class Attention(nn.Module):
    """Softmax attention, with Q/K norms (``qk_norm``: over head_dim, or over the whole
    projection for ``"full"``, OLMo 2's) and RoPE after them (``config.has_rotary``) and, in
    Qwen3-Next's hybrid (``mixer="gated_deltanet"``), its output gate: q_proj gives each
    head's query and gate, and the output is multiplied by the gate's sigmoid before o_proj.

    With ``impl="onnxnorm"`` the Q/K norms and the rotary are one rotary op of Q and K
    (:func:`onnxnorm.nn.norm_rotary`, with the norms ``q_norm`` and ``k_norm``); the
    decomposed impl spells them out as Hugging Face's attention layers do (the norms on
    [batch, seq, heads, head_dim], the transpose, ``apply_rotary_pos_emb``)."""

    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.heads, self.kv_heads = config.heads, config.kv_heads or config.heads
        d = self.head_dim = config.head_dim
        self.output_gate = config.mixer == "gated_deltanet"
        self.q_proj = nn.Linear(config.hidden, self.heads * d * (1 + self.output_gate), bias=False)
        self.k_proj = nn.Linear(config.hidden, self.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(config.hidden, self.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.heads * d, config.hidden, bias=False)
        self.full = config.qk_norm == "full"
        q_size, k_size = (self.heads * d, self.kv_heads * d) if self.full else (d, d)
        self.q_norm = make_norm(q_size, config) if config.qk_norm else None
        self.k_norm = make_norm(k_size, config) if config.qk_norm else None
        self.rotary = config.has_rotary
        self.rotary_float32 = config.rotary_float32
        self.fused = self.rotary and bool(config.qk_norm) and config.impl == "onnxnorm"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        heads = (batch, seq, -1, self.head_dim)
        q, k = self.q_proj(x), self.k_proj(x)
        if self.output_gate:
            q, gate = q.view(batch, seq, self.heads, -1).chunk(2, dim=-1)
        v = self.v_proj(x).view(heads).transpose(1, 2)
        if self.rotary:
            angle_type = torch.float32 if self.rotary_float32 else x.dtype
            cos, sin = rope_angles(seq, self.head_dim, angle_type, x.device)
        if self.fused:
            from onnxnorm.nn.rotary import norm_rotary

            if not self.full:
                q, k = q.view(heads), k.view(heads)
            q, k = norm_rotary(
                self.q_norm,
                self.k_norm,
                q,
                k,
                cos,
                sin,
                head_size=self.head_dim if self.full else 0,
                layout=2,
                per_head=not self.full,
                rotary_in_t=not self.rotary_float32,
            )
        else:
            if self.full and self.q_norm is not None and self.k_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = q.view(heads), k.view(heads)
            if not self.full and self.q_norm is not None and self.k_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = q.transpose(1, 2), k.transpose(1, 2)
            if self.rotary:
                q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if self.kv_heads != self.heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out = out.transpose(1, 2).reshape(batch, seq, -1)
        if self.output_gate:
            out = out * torch.sigmoid(gate.reshape(batch, seq, -1))
        return self.o_proj(out)


def _causal_conv(conv: nn.Conv1d, x: torch.Tensor) -> torch.Tensor:
    """The depthwise causal convolution of the linear mixers, then SiLU: [batch, seq, ch]."""
    seq = x.shape[1]
    return F.silu(conv(x.transpose(1, 2))[..., :seq].transpose(1, 2))


def gated_linear_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor
) -> torch.Tensor:
    """Causal linear attention with a per-head decay, in quadratic form:
    ``o_t = sum_{s <= t} exp(G_t - G_s) (q_t . k_s) v_s`` with ``G = cumsum(log_decay)``.
    q, k, v: [batch, seq, heads, dim]; log_decay: [batch, seq, heads] (<= 0)."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    cumulative = log_decay.transpose(1, 2).cumsum(-1)
    positions = torch.arange(q.shape[2], device=q.device)
    causal = positions[:, None] >= positions[None, :]
    difference = cumulative[..., :, None] - cumulative[..., None, :]
    decay = torch.where(causal, difference, torch.full_like(difference, float("-inf"))).exp()
    scores = (q @ k.transpose(-1, -2)) * decay
    return (scores @ v).transpose(1, 2)


class GatedDeltaNet(nn.Module):
    """Qwen3-Next's linear attention layer with its norms where Qwen3-Next has them, and its
    projections' shapes: ``in_proj_qkvz`` and ``in_proj_ba``, a causal depthwise convolution
    over q, k and v, then (in float32) L2Norm of the queries and keys over each head
    (``q_norm``, ``k_norm``: FLA's l2norm, epsilon 1e-6), and the core's output through a gated
    RMSNorm over each value head (``norm``: Qwen3NextRMSNormGated, norm then SiLU of z, weight
    ``[linear_head_dim]`` shared by the heads, group size ``linear_head_dim``) before
    ``out_proj``.

    The core is a stand-in for the gated delta rule: gated linear attention (decay ``exp(g)``
    per head from ``a``, values weighted by ``beta``) without the delta rule's correction,
    computed in quadratic form (:func:`gated_linear_attention`)."""

    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.heads, self.head_dim = config.heads, config.linear_head_dim
        width = self.heads * self.head_dim  # key_dim = value_dim
        self.split = [width] * 4
        self.in_proj_qkvz = nn.Linear(config.hidden, 4 * width, bias=False)
        self.in_proj_ba = nn.Linear(config.hidden, 2 * self.heads, bias=False)
        k = config.conv_kernel
        self.conv1d = nn.Conv1d(
            3 * width, 3 * width, k, groups=3 * width, padding=k - 1, bias=False
        )
        self.dt_bias = nn.Parameter(torch.ones(self.heads))
        self.A_log = nn.Parameter(torch.log(torch.linspace(1.0, 16.0, self.heads)))
        self.q_norm, self.k_norm = make_l2_norm(config), make_l2_norm(config)
        self.norm = make_gated_norm(self.head_dim, self.head_dim, config, norm_before_gate=True)
        self.out_proj = nn.Linear(width, config.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        heads = (batch, seq, self.heads, self.head_dim)
        q, k, v, z = self.in_proj_qkvz(x).split(self.split, dim=-1)
        b, a = self.in_proj_ba(x).chunk(2, dim=-1)
        q, k, v = _causal_conv(self.conv1d, torch.cat([q, k, v], dim=-1)).split(
            self.split[:3], dim=-1
        )
        q = self.q_norm(q.reshape(heads).float())
        k = self.k_norm(k.reshape(heads).float())
        beta = torch.sigmoid(b.float())
        log_decay = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        core = gated_linear_attention(
            q * self.head_dim**-0.5, k, v.reshape(heads).float() * beta[..., None], log_decay
        )
        core = core.to(x.dtype).reshape(batch, seq, -1)
        return self.out_proj(self.norm(core, z))


class Mamba2Mixer(nn.Module):
    """Mamba2's mixer with its norm where Mamba2 has it, and its projections' shapes:
    ``in_proj`` to the gate z, x, B, C (``mamba_groups`` groups of ``mamba_state``) and dt per
    head, a causal depthwise convolution over x, B and C, the scan, then a gated RMSNorm
    (``norm``: MambaRMSNormGated, SiLU of z multiplied into float32 of the scan's output first,
    then RMSNorm over ``mamba_groups`` groups, weight ``[intermediate]``) before ``out_proj``.

    The selective scan is a stand-in: per head a causal running mean of x weighted by
    ``softplus(dt + dt_bias)``, scaled per group by ``sigmoid(B . C)``, plus ``D * x``."""

    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.inner, self.heads = config.intermediate, config.heads
        self.groups, state = config.mamba_groups, config.mamba_state
        self.conv_dim = self.inner + 2 * self.groups * state
        self.in_proj = nn.Linear(config.hidden, self.inner + self.conv_dim + self.heads, bias=False)
        k = config.conv_kernel
        self.conv1d = nn.Conv1d(
            self.conv_dim, self.conv_dim, k, groups=self.conv_dim, padding=k - 1
        )
        self.dt_bias = nn.Parameter(torch.ones(self.heads))
        self.D = nn.Parameter(torch.ones(self.heads))
        self.norm = make_gated_norm(
            self.inner, self.inner // self.groups, config, norm_before_gate=False
        )
        self.out_proj = nn.Linear(self.inner, config.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        z, xbc, dt = self.in_proj(x).split([self.inner, self.conv_dim, self.heads], dim=-1)
        xbc = _causal_conv(self.conv1d, xbc)
        bc = self.conv_dim - self.inner
        hs, b, c = xbc.split([self.inner, bc // 2, bc // 2], dim=-1)
        hs = hs.float().reshape(batch, seq, self.heads, -1)
        dt = F.softplus(dt.float() + self.dt_bias)[..., None]
        y = (hs * dt).cumsum(1) / dt.cumsum(1) + self.D[:, None] * hs
        readout = torch.sigmoid((b * c).float().reshape(batch, seq, self.groups, -1).sum(-1))
        y = y.reshape(batch, seq, self.groups, -1) * readout[..., None]
        return self.out_proj(self.norm(y.reshape(batch, seq, -1).to(x.dtype), z))
