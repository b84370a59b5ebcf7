"""A small configurable decoder: every norm placement and variant that LLM families use, for the
tests, the demo and the benchmarks.

    config = DecoderConfig(norm="rms", position="sandwich", scale_offset=1.0, qk_norm=True)
    model = build(config)                       # onnxnorm modules, residual adds fused
    plain = build(replace(config, impl="decomposed"))   # same weights, norms spelled out

``impl="onnxnorm"`` uses onnxnorm.nn modules and its residual helpers, so that each residual add
and the norm after it export as one node; ``impl="decomposed"`` writes the norms and adds as
plain torch math (what a Hugging Face export holds, and what ``onnxnorm fuse`` rewrites). The
two compute the same function with the same parameter names, and :func:`build` gives them the
same weights for the same seed.

Norm placements (``position``), each for the attention and the MLP sublayer of every layer:

* ``pre``: x + F(Norm(x)), with a final norm (Llama, GPT-2, ...);
* ``post``: Norm(x + F(x)) (BERT, the original Transformer);
* ``sandwich``: x + Norm_post(F(Norm_pre(x))), with a final norm (Gemma 2/3, CogView);
* ``deepnorm``: LN(alpha * x + F(x)), DeepNet's alpha and beta-scaled initialization;
* ``reordered``: x + Norm(F(x)), with a final norm (OLMo 2).

Token mixers (``mixer``), for the norms of hybrid LLMs:

* ``attention``: softmax attention in every layer;
* ``gated_deltanet``: Qwen3-Next's hybrid. Every ``full_attention_interval``-th layer is
  softmax attention with Q/K norms and an output gate, the others linear attention
  (:class:`GatedDeltaNet`) whose queries and keys go through L2Norm and whose output goes
  through a gated RMSNorm over each value head (norm, then SiLU of the gate; weight
  ``[linear_head_dim]``, group size ``linear_head_dim``);
* ``mamba2``: Mamba2's stack, one sublayer per layer (norm, :class:`Mamba2Mixer`, residual
  add; no MLP), the mixer's output through a gated RMSNorm in ``mamba_groups`` groups with the
  gate applied first.

The linear-attention and state-space cores are simplified stand-ins (see their classes): the
norms sit where the real models put them, with the real shapes, but the recurrences are not the
models' own, so the outputs are not those of a Qwen3-Next or Mamba2 checkpoint.
"""

from __future__ import annotations

import collections
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from onnxnorm.nn.families import IMPLS, MIXERS, NORMS, POSITIONS, DecoderConfig


class DecomposedNorm(nn.Module):
    """A norm spelled out in torch ops, as Hugging Face writes them: float32 statistics, then
    the scale in X's type after rounding (order A) or in float32 with one rounding (order B)."""

    def __init__(self, shape: int, config: DecoderConfig):
        super().__init__()
        self.layer = config.norm == "layer"
        self.eps = config.eps
        self.offset = config.scale_offset
        self.order_a = bool(config.cast_before_scale)
        self.weight = nn.Parameter(torch.ones(shape) - self.offset) if config.weight else None
        self.bias = nn.Parameter(torch.zeros(shape)) if config.bias and config.weight else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        if self.layer:
            xf = xf - xf.mean(-1, keepdim=True)
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.order_a:
            y = y.to(x.dtype)
            if self.weight is not None:
                y = y * (
                    self.weight.to(x.dtype) + self.offset
                    if self.offset
                    else self.weight.to(x.dtype)
                )
            if self.bias is not None:
                y = y + self.bias.to(x.dtype)
            return y
        if self.weight is not None:
            y = y * (self.weight.float() + self.offset if self.offset else self.weight.float())
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype)


def make_norm(shape: int, config: DecoderConfig) -> nn.Module:
    if config.impl == "decomposed":
        return DecomposedNorm(shape, config)
    from onnxnorm.nn import LayerNorm, RMSNorm

    if config.norm == "rms":
        norm = RMSNorm(
            shape,
            eps=config.eps,
            elementwise_affine=config.weight,
            scale_offset=config.scale_offset,
            cast_before_scale=config.cast_before_scale,
        )
    else:
        norm = LayerNorm(
            shape,
            eps=config.eps,
            elementwise_affine=config.weight,
            bias=config.bias,
            cast_before_scale=config.cast_before_scale,
        )
    return norm


class DecomposedGatedNorm(nn.Module):
    """A gated RMSNorm spelled out as Hugging Face writes it: Qwen3NextRMSNormGated's (norm,
    then SiLU gate) or MambaRMSNormGated's (SiLU gate on float32(x), then the norm in groups),
    both rounding in order A. A weight of one group's size is shared by every group (Qwen3-Next
    reshapes its heads to rows for that)."""

    def __init__(self, hidden: int, group_size: int, eps: float, norm_before_gate: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.variance_epsilon = eps
        self.group_size = group_size
        self.norm_before_gate = norm_before_gate

    def forward(self, hidden_states: torch.Tensor, gate: torch.Tensor | None = None):
        dtype = hidden_states.dtype
        h = hidden_states.to(torch.float32)
        if gate is not None and not self.norm_before_gate:
            h = h * F.silu(gate.to(torch.float32))
        *prefix, last = h.shape
        groups = h.view(*prefix, last // self.group_size, self.group_size)
        variance = groups.pow(2).mean(-1, keepdim=True)
        groups = groups * torch.rsqrt(variance + self.variance_epsilon)
        if self.weight.numel() == self.group_size:
            h = (self.weight * groups.to(dtype)).view(*prefix, last)
        else:
            h = self.weight * groups.view(*prefix, last).to(dtype)
        if gate is not None and self.norm_before_gate:
            h = (h * F.silu(gate.to(torch.float32))).to(dtype)
        return h


class DecomposedL2Norm(nn.Module):
    """FLA's ``l2norm`` as Qwen3-Next's modeling code writes it (``x * rsqrt(sum(x*x) +
    eps)``), as a module so that :func:`onnxnorm.convert` finds it."""

    def __init__(self, eps: float = 1e-6):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + self.eps)


def make_gated_norm(
    hidden: int, group_size: int, config: DecoderConfig, norm_before_gate: bool
) -> nn.Module:
    """The gated RMSNorm of the hybrid mixers (SiLU, order A, weight at 1: as Qwen3-Next's and
    Mamba2's are, whatever the decoder's other norms do)."""
    if config.impl == "decomposed":
        return DecomposedGatedNorm(hidden, group_size, config.eps, norm_before_gate)
    from onnxnorm.nn import GatedRMSNorm

    return GatedRMSNorm(
        hidden, group_size=group_size, eps=config.eps, norm_before_gate=norm_before_gate
    )


def make_l2_norm(config: DecoderConfig) -> nn.Module:
    """The L2 norm of linear attention's queries and keys (epsilon 1e-6, as FLA's)."""
    if config.impl == "decomposed":
        return DecomposedL2Norm(1e-6)
    from onnxnorm.nn import L2Norm

    return L2Norm(1e-6)


class DecomposedStream:
    """The residual stream for ``impl="decomposed"``: the same interface as
    :class:`onnxnorm.nn.ResidualStream`, with every add and norm as separate torch ops."""

    def __init__(self, x: torch.Tensor):
        self.x = x

    def normalize(self, norm: nn.Module) -> tuple[torch.Tensor, DecomposedStream]:
        return norm(self.x), self

    def add(self, delta: torch.Tensor, norm: nn.Module | None = None) -> DecomposedStream:
        return DecomposedStream(self.x + (norm(delta) if norm is not None else delta))

    def post_norm(
        self, delta: torch.Tensor, norm: nn.Module, alpha: float = 1.0
    ) -> DecomposedStream:
        if alpha == 1.0:
            return DecomposedStream(norm(self.x + delta))
        # DeepNorm's scaled add in float32, rounded once (as the catalogue's Skip ops do)
        return DecomposedStream(norm((alpha * self.x.float() + delta.float()).to(delta.dtype)))

    def value(self) -> torch.Tensor:
        return self.x

    def finish(self, norm: nn.Module | None = None) -> torch.Tensor:
        return norm(self.x) if norm is not None else self.x


class Attention(nn.Module):
    """Softmax attention, with Q/K norms over head_dim (``qk_norm``) and, in Qwen3-Next's
    hybrid (``mixer="gated_deltanet"``), its output gate: q_proj gives each head's query and
    gate, and the output is multiplied by the gate's sigmoid before o_proj."""

    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.heads, self.kv_heads = config.heads, config.kv_heads or config.heads
        d = config.head_dim
        self.output_gate = config.mixer == "gated_deltanet"
        self.q_proj = nn.Linear(config.hidden, self.heads * d * (1 + self.output_gate), bias=False)
        self.k_proj = nn.Linear(config.hidden, self.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(config.hidden, self.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.heads * d, config.hidden, bias=False)
        self.q_norm = make_norm(d, config) if config.qk_norm else None
        self.k_norm = make_norm(d, config) if config.qk_norm else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.q_proj(x).view(batch, seq, self.heads, -1)
        if self.output_gate:
            q, gate = q.chunk(2, dim=-1)
        k = self.k_proj(x).view(batch, seq, self.kv_heads, -1)
        v = self.v_proj(x).view(batch, seq, self.kv_heads, -1)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
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


class MLP(nn.Module):
    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden, config.intermediate, bias=False)
        self.up_proj = nn.Linear(config.hidden, config.intermediate, bias=False)
        self.down_proj = nn.Linear(config.intermediate, config.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """A token mixer (attention, or linear attention in Qwen3-Next's hybrid) and an MLP
    sublayer with their norms at ``config.position``."""

    def __init__(self, config: DecoderConfig, index: int = 0):
        super().__init__()
        self.position = config.position
        pre = config.position in ("pre", "sandwich")
        post = config.position != "pre"
        self.input_layernorm = make_norm(config.hidden, config) if pre else None
        if config.layer_kind(index) == "linear_attention":
            self.linear_attn = GatedDeltaNet(config)
            self.mixer_name = "linear_attn"
        else:
            self.self_attn = Attention(config)
            self.mixer_name = "self_attn"
        self.post_attention_layernorm = make_norm(config.hidden, config) if post else None
        self.pre_feedforward_layernorm = make_norm(config.hidden, config) if pre else None
        self.mlp = MLP(config)
        self.post_feedforward_layernorm = make_norm(config.hidden, config) if post else None
        self.alpha = config.deepnorm.alpha if config.position == "deepnorm" else 1.0
        if config.position == "deepnorm":
            from onnxnorm.nn import deepnorm_init_

            a, m = self.mixer, self.mlp
            deepnorm_init_(
                [m.gate_proj, m.up_proj, m.down_proj, a.v_proj, a.o_proj],
                config.deepnorm.beta,
                unscaled=[a.q_proj, a.k_proj],
            )

    @property
    def mixer(self) -> nn.Module:
        """The token mixer: ``self_attn`` or ``linear_attn``."""
        return getattr(self, self.mixer_name)

    def _sublayer(
        self, stream: Any, pre: nn.Module | None, sublayer: nn.Module, post: nn.Module | None
    ) -> Any:
        if self.position in ("pre", "sandwich"):
            h, stream = stream.normalize(pre)
            return stream.add(sublayer(h), post)
        if self.position == "reordered":
            return stream.add(sublayer(stream.value()), post)
        return stream.post_norm(sublayer(stream.value()), post, self.alpha)

    def forward(self, stream: Any) -> Any:
        stream = self._sublayer(
            stream, self.input_layernorm, self.mixer, self.post_attention_layernorm
        )
        return self._sublayer(
            stream, self.pre_feedforward_layernorm, self.mlp, self.post_feedforward_layernorm
        )


class MambaLayer(nn.Module):
    """Mamba2's block: x + Mixer(Norm(x)), no MLP."""

    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.norm = make_norm(config.hidden, config)
        self.mixer = Mamba2Mixer(config)

    def forward(self, stream: Any) -> Any:
        h, stream = stream.normalize(self.norm)
        return stream.add(self.mixer(h))


def make_layer(config: DecoderConfig, index: int) -> nn.Module:
    if config.layer_kind(index) == "mamba2":
        return MambaLayer(config)
    return DecoderLayer(config, index)


class Decoder(nn.Module):
    """Embedding (when ``vocab`` is set) and its norm, the layers, the final norm, the LM head."""

    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab, config.hidden) if config.vocab else None
        self.embedding_norm = make_norm(config.hidden, config) if config.embedding_norm else None
        self.layers = nn.ModuleList(make_layer(config, i) for i in range(config.layers))
        self.norm = make_norm(config.hidden, config) if config.has_final_norm else None
        self.lm_head = nn.Linear(config.hidden, config.vocab, bias=False) if config.vocab else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed_tokens is not None:
            x = self.embed_tokens(x)
        if self.embedding_norm is not None:
            x = self.embedding_norm(x)
        if self.config.impl == "onnxnorm":
            from onnxnorm.nn import ResidualStream

            stream: Any = ResidualStream(x)
        else:
            stream = DecomposedStream(x)
        for layer in self.layers:
            stream = layer(stream)
        x = stream.finish(self.norm)
        return self.lm_head(x) if self.lm_head is not None else x

    def norm_modules(self) -> list[nn.Module]:
        kinds = (DecomposedNorm, DecomposedGatedNorm, DecomposedL2Norm)
        try:
            from onnxnorm.nn.modules import NORM_TYPES

            kinds += NORM_TYPES
        except ImportError:
            pass
        return [m for m in self.modules() if isinstance(m, kinds)]

    def count_norms(self) -> int:
        return len(self.norm_modules())

    def expected_nodes(self) -> collections.Counter:
        """The onnxnorm nodes that the export of the ``onnxnorm`` impl holds, by op type: one
        per norm, or per residual add fused with the norm after it."""
        c = self.config
        kind = "RMSNorm" if c.norm == "rms" else "LayerNorm"
        kinds = [c.layer_kind(i) for i in range(c.layers)]
        nodes: collections.Counter = collections.Counter()
        nodes[kind] += int(c.embedding_norm) + 2 * kinds.count("attention") * int(c.qk_norm)
        # a gated norm in each linear-attention and Mamba2 layer, L2Norms of q and k in the first
        nodes["GatedRMSNorm"] += kinds.count("linear_attention") + kinds.count("mamba2")
        nodes["L2Norm"] += 2 * kinds.count("linear_attention")
        sublayers = 2 * c.layers - kinds.count("mamba2")  # a Mamba2 layer has no MLP
        if c.position == "pre":
            nodes[kind] += 1  # the first norm has no residual add before it
            nodes["Skip" + kind] += sublayers - 1 + int(c.has_final_norm)
        elif c.position == "sandwich":
            nodes[kind] += 1
            nodes["Sandwich" + kind] += sublayers - 1 + int(c.has_final_norm)
            nodes[kind] += int(not c.has_final_norm)  # the last post-norm, unfused
        elif c.position == "reordered":
            # each post-sublayer norm is added by itself; the last one fuses with the final norm
            nodes[kind] += sublayers - int(c.has_final_norm)
            nodes["Sandwich" + kind] += int(c.has_final_norm)
        else:
            nodes["Skip" + kind] += sublayers
            nodes[kind] += int(c.has_final_norm)
        return +nodes


def build(config: DecoderConfig | None = None, seed: int = 0) -> Decoder:
    """A decoder in eval mode with random weights, the norm weights and biases included (so that
    a wrong scale cannot pass a parity test); the same seed gives both impls the same weights."""
    config = config or DecoderConfig()
    torch.manual_seed(seed)
    model = Decoder(config).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, module in model.named_modules():
            if not name.rsplit(".", 1)[-1].endswith("norm"):
                continue
            # each norm's own offset: the gated norms of the hybrids have none
            offset = getattr(module, "scale_offset", getattr(module, "offset", 0.0))
            for parameter_name, parameter in module.named_parameters(recurse=False):
                noise = 0.1 * torch.randn(parameter.shape, generator=generator)
                parameter.copy_(1.0 - offset + noise if parameter_name == "weight" else noise)
    return model


def example_input(
    config: DecoderConfig,
    batch: int = 2,
    seq: int = 8,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> torch.Tensor:
    """Token ids (``vocab`` set) or hidden states for the model of ``config``."""
    generator = torch.Generator().manual_seed(seed)
    if config.vocab:
        return torch.randint(0, config.vocab, (batch, seq), generator=generator)
    return torch.randn(batch, seq, config.hidden, generator=generator).to(dtype)


def size_in_parameters(config: DecoderConfig) -> int:
    """The number of parameters of the model of ``config`` (without building it)."""
    with torch.device("meta"):
        return sum(p.numel() for p in Decoder(config).parameters())


__all__ = [
    "Decoder",
    "DecoderConfig",
    "DecomposedGatedNorm",
    "DecomposedL2Norm",
    "DecomposedNorm",
    "GatedDeltaNet",
    "IMPLS",
    "MIXERS",
    "Mamba2Mixer",
    "NORMS",
    "POSITIONS",
    "build",
    "example_input",
    "make_gated_norm",
    "make_l2_norm",
    "make_norm",
    "size_in_parameters",
]
