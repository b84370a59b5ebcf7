"""ONNX Runtime's CUDA execution provider around onnxnorm nodes, beyond one node per op
(test_cuda.py): a small float16 decoder exported with onnxnorm's own exporter, bound to device
buffers, with no host copies around its onnxnorm nodes; the same decoder captured and replayed as
a CUDA graph; the bfloat16 function bodies (no library registered) on the CUDA provider; and a
float16 norm whose activations exceed 256, where the decomposed norm as exported overflows and
onnxnorm's fused op does not.

The GPU tests need onnxruntime-gpu with the CUDA provider, a GPU visible to torch and the built
CUDA library (tests.support.gpu.needs_ort_cuda). Each has a twin that runs the same helpers on
the CPU provider, so that the GPU tests' code is exercised on every machine. Run on a GPU machine
with ``-rA`` (or ``-s``) to see what they print: where ORT placed the body's nodes, and what the
decomposed float16 norm returns on each provider.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import json
import re

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnxnorm import OnnxNormError, ops, runtime
from onnxnorm.testing.graphs import numpy_type, single_node_model
from tests.support.gpu import needs_ort_cuda, run_on_cuda_provider
from tests.support.helpers import run_session
from tests.support.matrix import BF16

CUDA = runtime.CUDA_PROVIDER
CPU = "CPUExecutionProvider"
#: ORT's profiler names these element types in a kernel's input_type_shape / output_type_shape
FLOATING = frozenset({"float", "float16", "bfloat16", "double"})
MEMCPY_OPS = frozenset({"MemcpyToHost", "MemcpyFromHost"})
#: a 2-layer decoder in float16 against another provider or float32: each fp16 op is within
#: 2e-3 (ops.reference.tolerance), and a decoder chains about ten of them (MatMuls accumulated in
#: another order by cuBLAS and MLAS, Softmax, the norms); measured on the CPU against the float32
#: eager model: at most 4.3e-3 absolute for outputs up to 3.7
DECODER_RTOL = DECODER_ATOL = 1e-2
#: float16 against float32 for one norm computed in float32 and rounded once (order B)
F16_RTOL, F16_ATOL = 1e-3, 1e-4
EPS = 1e-5


def _library_built() -> bool:
    try:
        runtime.library_path()
    except OnnxNormError:
        return False
    return True


needs_library = pytest.mark.skipif(not _library_built(), reason="the onnxnorm library is not built")


# ---------------------------------------------------------------------------------------------
# Helpers (shared by the GPU tests and their CPU twins)
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Kernel:
    """One kernel run from ORT's profile: its node, op type, provider and the element types of
    its inputs and outputs."""

    node: str
    op: str
    provider: str
    types: frozenset

    def __str__(self) -> str:
        return f"{self.node} ({self.op}: {', '.join(sorted(self.types))})"


_PROFILES = itertools.count()


def _profiling(folder) -> object:
    """Session options with ORT's profiler on, writing into ``folder`` (a prefix of its own for
    each session: ORT names the file after the session's start, to the millisecond)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(folder / f"profile{next(_PROFILES)}")
    return options


def _kernels(sess) -> list[Kernel]:
    """The kernels that ran in ``sess`` (profiling on) since it was created; ends profiling."""
    with open(sess.end_profiling()) as f:
        events = json.load(f)
    found = []
    for event in events:
        name = event.get("name", "")
        if event.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        args = event.get("args", {})
        shapes = args.get("input_type_shape", []) + args.get("output_type_shape", [])
        types = frozenset(t for item in shapes for t in item)
        found.append(
            Kernel(name[: -len("_kernel_time")], args.get("op_name"), args.get("provider"), types)
        )
    return found


def _compute_on_cpu(kernels: list[Kernel]) -> list[Kernel]:
    """Kernels on the CPU provider that read or write floating-point tensors: compute, as
    opposed to the int64 shape arithmetic that ORT places on the CPU on purpose."""
    return [k for k in kernels if k.provider == CPU and k.types & FLOATING]


def _memcpy(kernels: list[Kernel]) -> list[Kernel]:
    return [k for k in kernels if k.op in MEMCPY_OPS]


@dataclasses.dataclass(frozen=True)
class Decoder:
    model: bytes  # the exported model (function bodies attached)
    expected: collections.Counter  # onnxnorm nodes by op type, from the torch model's config
    shape: tuple[int, ...]  # the static shape of its one input, hidden states
    eager: object  # the same decoder in float32 (torch), for the CPU twin


@functools.cache
def _decoder() -> Decoder:
    """A 2-layer Llama-style decoder (hidden 64, 4 heads, one sequence of 8 tokens) exported
    with onnxnorm's exporter in float16 with static shapes, as ``onnxnorm export llama --static
    --dtype float16`` does: 1 RMSNorm and 4 SkipRMSNorm nodes with their function bodies."""
    torch = pytest.importorskip("torch")
    from onnxnorm.nn import decoder, families
    from onnxnorm.nn.converter import convert
    from onnxnorm.nn.exporter import export

    config = families.decoder_config("llama", hidden=64, heads=4, intermediate=128, layers=2)
    eager = decoder.build(config)
    half = decoder.build(config).to(torch.float16)
    convert(half)
    example = decoder.example_input(config, batch=1, seq=8, dtype=torch.float16)
    proto = export(half, (example,), dynamic=False)
    return Decoder(
        proto.SerializeToString(), eager.expected_nodes(), tuple(example.shape), eager.eval()
    )


def _hidden_states(shape, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float16)


def _bound_runs(sess, feeds: list[np.ndarray], device: str) -> list[list[np.ndarray]]:
    """Runs ``sess`` (one input) once per array of ``feeds`` through one IOBinding whose input
    and outputs are buffers on ``device`` ("cuda" or "cpu") allocated once: each array is
    copied into the same input buffer (OrtValue.update_inplace), as a CUDA graph needs. Returns
    each run's outputs, copied to the host; checks that the bound buffers stayed the same."""
    import onnxruntime as ort

    (name,) = [i.name for i in sess.get_inputs()]
    x = ort.OrtValue.ortvalue_from_numpy(feeds[0], device, 0)
    outputs = [
        ort.OrtValue.ortvalue_from_shape_and_type(o.shape, numpy_type(o.type), device, 0)
        for o in sess.get_outputs()
    ]
    binding = sess.io_binding()
    binding.bind_ortvalue_input(name, x)
    for info, value in zip(sess.get_outputs(), outputs):
        binding.bind_ortvalue_output(info.name, value)
    pointers = [x.data_ptr()] + [v.data_ptr() for v in outputs]
    results = []
    for feed in feeds:
        x.update_inplace(feed)
        sess.run_with_iobinding(binding)
        binding.synchronize_outputs()
        results.append([np.array(v.numpy(), copy=True) for v in outputs])
    bound = binding.get_outputs()
    assert [x.data_ptr()] + [v.data_ptr() for v in bound] == pointers, "a bound buffer moved"
    assert all(v.device_name().lower() == device for v in [x, *bound]), [
        v.device_name() for v in bound
    ]
    return results


def _check_decoder_kernels(kernels: list[Kernel], expected, provider: str) -> None:
    """Every onnxnorm node of the decoder ran its library kernel (the op's own name in the
    profile, not its body's ops) on ``provider``, once per node; no Memcpy node anywhere."""
    ran = collections.Counter(k.op for k in kernels if k.op in ops.OPS)
    assert ran == expected, f"onnxnorm kernels that ran {dict(ran)}, want {dict(expected)}"
    where = {(k.op, k.provider) for k in kernels if k.op in ops.OPS}
    assert {p for _, p in where} == {provider}, sorted(where)
    copies = _memcpy(kernels)
    assert not copies, "host-device copies: " + "; ".join(map(str, copies))


def _graph_providers():
    return [(CUDA, {"enable_cuda_graph": "1"}), CPU]


# --- the one-node bfloat16 models with their function bodies --------------------------------
def _body_cases():
    for op, spec in ops.catalogue.FLOAT_OPS.items():
        if spec.gated:
            yield pytest.param(op, {"group_size": 16}, id=f"{op}-silu-group16")
            attrs = {"group_size": 16, "activation": 1, "norm_before_gate": 0}
            yield pytest.param(op, attrs, id=f"{op}-sigmoid-gatefirst-group16")
        elif spec.norm == "l2":
            yield pytest.param(op, {"epsilon": 1e-6}, id=op)
        else:
            yield pytest.param(op, {"cast_before_scale": 1}, id=op)


def _bf16_arrays(op: str) -> dict[str, np.ndarray]:
    """bfloat16 inputs of shape (2, 3, 64) for op: X (and Residual, Gate), weights near 1 (or 0
    for the biases) of shape (64,)."""
    spec = ops.OPS[op]
    rng = np.random.default_rng(7)
    shape = (2, 3, 64)
    arrays = {"X": (2 * rng.standard_normal(shape) + 0.5).astype(BF16)}
    if spec.has_residual:
        arrays["Residual"] = rng.standard_normal(shape).astype(BF16)
    for name in spec.optional_inputs:
        if name == "Gate":
            arrays[name] = (2 * rng.standard_normal(shape)).astype(BF16)
        elif "Bias" in name:
            arrays[name] = (0.1 * rng.standard_normal(64)).astype(BF16)
        else:
            arrays[name] = (1 + 0.1 * rng.standard_normal(64)).astype(BF16)
    return arrays


def _body_model(op: str, arrays, attrs) -> onnx.ModelProto:
    """One node of op with its function body (bfloat16 Y cast to float32 in the graph)."""
    model = single_node_model(op, arrays, attrs)
    assert [(f.domain, f.name) for f in model.functions] == [(ops.DOMAIN, op)], op
    return model


def _check_against_reference(op: str, arrays, attrs, got) -> None:
    spec = ops.OPS[op]
    want = ops.reference.run(op, *[arrays.get(p.name) for p in spec.inputs], **attrs)
    assert len(got) == len(want), (op, len(got), len(want))
    for g, w, p in zip(got, want, spec.outputs):
        np.testing.assert_allclose(
            np.asarray(g, np.float32),
            w.astype(np.float32),
            *ops.reference.tolerance(BF16),
            err_msg=f"{op} {p.name} {attrs}",
        )


def _body_placement(kernels: list[Kernel], op: str) -> str:
    off_cuda = [k for k in kernels if k.provider != CUDA]
    placed = collections.Counter((k.op, k.provider) for k in kernels)
    return (
        f"{op}: the inlined body ran {sum(placed.values())} kernels "
        f"{dict(sorted(placed.items()))}; off the CUDA provider: "
        + ("; ".join(f"{k} on {k.provider}" for k in off_cuda) or "none")
    )


# --- the float16 norm over activations above 256 ---------------------------------------------
def _large_activations() -> tuple[np.ndarray, np.ndarray]:
    """X (4, 128) float16 with every |x| in [300, 600] (x * x > 65504, float16's largest
    value), random signs; Scale near 1."""
    rng = np.random.default_rng(3)
    shape = (4, 128)
    x = rng.uniform(300, 600, shape) * rng.choice([-1.0, 1.0], shape)
    scale = 1 + 0.1 * rng.standard_normal(shape[-1])
    return x.astype(np.float16), scale.astype(np.float16)


def _decomposed_norm(norm: str, dtype, shape) -> onnx.ModelProto:
    """The norm over the last axis written out the way an exporter writes a model cast with
    .half() without upcasting: every op in ``dtype``. rms: Pow(x, 2), ReduceMean, Add eps, Sqrt,
    Div, Mul Scale; layer: the same on x - ReduceMean(x)."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    constants = [
        numpy_helper.from_array(np.array([-1], np.int64), "axes"),
        numpy_helper.from_array(np.array(2, dtype), "two"),
        numpy_helper.from_array(np.array(EPS, dtype), "eps"),
    ]
    nodes = []
    centered = "x"
    if norm == "layer":
        nodes += [
            helper.make_node("ReduceMean", ["x", "axes"], ["mean"]),
            helper.make_node("Sub", ["x", "mean"], ["centered"]),
        ]
        centered = "centered"
    nodes += [
        helper.make_node("Pow", [centered, "two"], ["square"]),
        helper.make_node("ReduceMean", ["square", "axes"], ["mean_square"]),
        helper.make_node("Add", ["mean_square", "eps"], ["variance"]),
        helper.make_node("Sqrt", ["variance"], ["std"]),
        helper.make_node("Div", [centered, "std"], ["normalized"]),
        helper.make_node("Mul", ["normalized", "scale"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        f"decomposed_{norm}_norm",
        [
            helper.make_tensor_value_info("x", elem, shape),
            helper.make_tensor_value_info("scale", elem, shape[-1:]),
        ],
        [helper.make_tensor_value_info("y", elem, shape)],
        constants,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _run_decomposed(norm, x, scale, providers, optimized: bool, folder):
    """The decomposed norm in x's type on ``providers``: Y and the kernels that ran. Not
    ``optimized``: ORT's graph optimizations off (ORT_DISABLE_ALL), each op as written."""
    import onnxruntime as ort

    options = _profiling(folder)
    if not optimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    model = _decomposed_norm(norm, x.dtype.type, x.shape).SerializeToString()
    sess = ort.InferenceSession(model, options, providers=list(providers))
    y = sess.run(None, {"x": x, "scale": scale})[0]
    return y, _kernels(sess)


def _float32_result(norm, x, scale) -> np.ndarray:
    """The float32 model's Y: the decomposed norm in float32 (ORT, CPU)."""
    import onnxruntime as ort

    model = _decomposed_norm(norm, np.float32, x.shape).SerializeToString()
    sess = ort.InferenceSession(model, providers=[CPU])
    feeds = {"x": x.astype(np.float32), "scale": scale.astype(np.float32)}
    return sess.run(None, feeds)[0]


def _verdict(got: np.ndarray, want: np.ndarray) -> str:
    """What a float16 result is against the float32 one: "right" (within float16 tolerance),
    "zeros", "Inf" or "NaN" (all of it), else the counts of each with the largest error."""
    g = np.asarray(got, np.float32)
    if np.allclose(g, want, F16_RTOL, F16_ATOL):
        return "right"
    kinds = {"zeros": g == 0, "Inf": np.isinf(g), "NaN": np.isnan(g)}
    for name, where in kinds.items():
        if where.all():
            return name
    counts = ", ".join(f"{int(w.sum())} {name}" for name, w in kinds.items() if w.any())
    finite = np.isfinite(g)
    error = float(np.max(np.abs(g[finite] - want[finite]), initial=0.0))
    return (
        f"wrong ({counts or 'all finite, nonzero'} of {g.size}; largest finite error {error:.3g})"
    )


def _far(got: np.ndarray, want: np.ndarray) -> bool:
    """Far from the float32 result: any Inf or NaN, or an error above 0.1 (Y is of order 1)."""
    g = np.asarray(got, np.float32)
    return not np.isfinite(g).all() or float(np.max(np.abs(g - want))) > 0.1


def _fused_op(norm: str) -> str:
    return {"rms": "RMSNorm", "layer": "LayerNorm"}[norm]


_FUSED_ATTRS = {"epsilon": EPS, "cast_before_scale": 0}  # order B: one rounding to float16


def _ran(kernels: list[Kernel]) -> str:
    placed = collections.Counter(
        (k.op, k.provider.replace("ExecutionProvider", "")) for k in kernels
    )
    return ", ".join(f"{op}@{p} x{n}" if n > 1 else f"{op}@{p}" for (op, p), n in placed.items())


# ---------------------------------------------------------------------------------------------
# GPU machine (onnxruntime-gpu)
# ---------------------------------------------------------------------------------------------
@needs_ort_cuda
def test_decoder_on_cuda_has_no_host_copies(tmp_path):
    """The float16 decoder on the CUDA provider, its input and outputs bound to device buffers,
    the profiler on: each onnxnorm node ran its kernel on the CUDA provider, no MemcpyToHost /
    MemcpyFromHost node ran (and no floating-point compute on the CPU), and the outputs equal the
    same model's on the CPU provider with the onnxnorm library within float16 tolerance."""
    decoder = _decoder()
    x = _hidden_states(decoder.shape, seed=1)
    sess = runtime.session(decoder.model, _profiling(tmp_path), providers=runtime.CUDA_PROVIDERS)
    (got,) = _bound_runs(sess, [x], "cuda")
    kernels = _kernels(sess)
    _check_decoder_kernels(kernels, decoder.expected, CUDA)
    on_cpu = _compute_on_cpu(kernels)
    assert not on_cpu, "floating-point kernels on the CPU: " + "; ".join(map(str, on_cpu))
    cpu = runtime.session(decoder.model)
    want = cpu.run(None, {cpu.get_inputs()[0].name: x})
    for g, w in zip(got, want, strict=True):
        assert g.dtype == np.float16 and np.isfinite(g).all()
        np.testing.assert_allclose(
            g.astype(np.float32), w.astype(np.float32), DECODER_RTOL, DECODER_ATOL
        )


@needs_ort_cuda
def test_cuda_graph_captures_and_replays_a_decoder_with_onnxnorm_nodes(capfd):
    """The decoder in a session with CUDA graphs enabled (every node on the CUDA provider, input
    and outputs bound to fixed device buffers): five runs, each with new values copied into the
    same input buffer, each run's outputs equal to a session's without graphs on the same values.
    ORT captures within the first run (recent versions repeat the run inside the call: two
    regular runs, the capture, a replay; older ones capture on the third call), so the later runs
    are replays, which give each input's outputs only when the onnxnorm kernels are in the graph
    reading the bound buffers. ORT captures on its compute stream in global mode: a kernel
    launched on another stream would fail the capture or be missing from the replays. ORT
    refusing the graph (a custom op, a node off the CUDA provider) fails the test with ORT's
    message. ORT's log lines about the capture are printed (-s or -rA)."""
    import onnxruntime as ort

    decoder = _decoder()
    feeds = [_hidden_states(decoder.shape, seed) for seed in range(10, 15)]
    plain = runtime.session(decoder.model, providers=runtime.CUDA_PROVIDERS)
    name = plain.get_inputs()[0].name
    want = [plain.run(None, {name: x}) for x in feeds]
    for a, b in itertools.pairwise(want):
        assert not np.allclose(a[0], b[0]), "the inputs must give different outputs"
    options = ort.SessionOptions()
    options.log_severity_level = 0  # ORT's own lines about the capture (printed below)
    ort.set_default_logger_severity(0)
    try:
        graph = runtime.session(decoder.model, options, providers=_graph_providers())
        got = _bound_runs(graph, feeds, "cuda")
    except Exception as error:  # noqa: BLE001 - ORT's message is the finding
        pytest.fail(
            f"ONNX Runtime refused or failed the CUDA graph: {type(error).__name__}: {error}"
        )
    finally:
        ort.set_default_logger_severity(2)  # ORT's default, warnings
    logged = capfd.readouterr().err.splitlines()
    capture = [line for line in logged if re.search(r"captur|replay", line, re.IGNORECASE)]
    print("ORT's lines about the CUDA graph:", *capture[-8:] or ["(none)"], sep="\n  ")
    options_used = graph.get_provider_options().get(CUDA, {})
    assert options_used.get("enable_cuda_graph") in ("1", "true"), options_used
    for run, (g, w) in enumerate(zip(got, want, strict=True)):
        for a, b in zip(g, w, strict=True):
            np.testing.assert_allclose(
                a.astype(np.float32),
                b.astype(np.float32),
                *ops.reference.tolerance(np.float16),
                err_msg=f"run {run + 1} of the CUDA graph session",
            )


@needs_ort_cuda
@pytest.mark.parametrize("op, attrs", _body_cases())
def test_function_body_fallback_in_bfloat16_on_cuda(op, attrs, tmp_path):
    """A one-node bfloat16 model of op with its function body, on the CUDA provider without the
    onnxnorm library: ORT inlines the body, creates the session and runs it; the outputs are the
    reference's within bfloat16 tolerance. Prints where ORT placed the body's nodes (-s or -rA),
    and fails if any floating-point kernel of the body ran on the CPU (a bfloat16 kernel the
    CUDA provider lacks: change the body) or a Memcpy node ran."""
    arrays = _bf16_arrays(op)
    model = _body_model(op, arrays, attrs)
    try:
        sess = runtime.session(
            model, _profiling(tmp_path), providers=runtime.CUDA_PROVIDERS, with_library=False
        )
        got = run_session(sess, arrays)
    except Exception as error:  # noqa: BLE001 - ORT's message is the finding
        pytest.fail(
            f"{op}: the bfloat16 body on the CUDA provider: {type(error).__name__}: {error}"
        )
    kernels = _kernels(sess)
    report = _body_placement(kernels, op)
    print(report)
    assert op not in {k.op for k in kernels}, f"{op} ran a kernel, not its body: " + report
    _check_against_reference(op, arrays, attrs, got)
    assert not _compute_on_cpu(kernels) and not _memcpy(kernels), report


@needs_ort_cuda
@pytest.mark.parametrize("norm", ["rms", "layer"])
def test_float16_activations_over_256(norm, tmp_path):
    """float16 rows whose every |x| is above 256, so that x * x overflows float16: (a) the
    decomposed norm as exported (every op in float16), run on CUDA with ORT's optimizations off
    (each op as written), returns values far from the float32 model's; which (zeros, Inf, NaN)
    is printed and in the message, with the same graph on the CPU provider and on CUDA with ORT's
    default optimizations (whose fusions may compute it in float32) for comparison; (b) onnxnorm's
    fused op (library registered) on CUDA, and its function body without the library, return the
    float32 model's values within float16 tolerance (rtol 1e-3)."""
    x, scale = _large_activations()
    want = _float32_result(norm, x, scale)
    runs = {
        "CUDA": _run_decomposed(norm, x, scale, runtime.CUDA_PROVIDERS, False, tmp_path),
        "CUDA, ORT's default optimizations": _run_decomposed(
            norm, x, scale, runtime.CUDA_PROVIDERS, True, tmp_path
        ),
        "CPU": _run_decomposed(norm, x, scale, [CPU], False, tmp_path),
    }
    lines = [
        f"decomposed float16 {norm} norm, |x| > 256, on {where}: {_verdict(y, want)} "
        f"[ran: {_ran(kernels)}]"
        for where, (y, kernels) in runs.items()
    ]
    op = _fused_op(norm)
    arrays = {"X": x, "Scale": scale}
    fused = run_on_cuda_provider(op, arrays, _FUSED_ATTRS)[0]
    lines.append(f"onnxnorm {op} (library) on CUDA: {_verdict(fused, want)}")
    body_model = single_node_model(op, arrays, _FUSED_ATTRS)
    body = runtime.session(body_model, providers=runtime.CUDA_PROVIDERS, with_library=False)
    body_y = body.run(None, {"x": x, "scale": scale})[0]
    lines.append(f"onnxnorm {op} function body (no library) on CUDA: {_verdict(body_y, want)}")
    print("\n".join(lines))
    message = "\n".join(lines)
    problems = []
    y, _ = runs["CUDA"]
    if not _far(y, want):
        problems.append("the decomposed float16 norm is not wrong on CUDA")
    for label, got in (("fused op", fused), ("function body", body_y)):
        if not np.allclose(np.asarray(got, np.float32), want, F16_RTOL, F16_ATOL):
            problems.append(f"onnxnorm's {label} is not the float32 model's within 1e-3")
    assert not problems, "; ".join(problems) + "\n" + message


# ---------------------------------------------------------------------------------------------
# Any machine: the same helpers on the CPU provider
# ---------------------------------------------------------------------------------------------
@needs_library
def test_decoder_builder_and_bound_run_on_cpu(tmp_path):
    """The decoder of the GPU tests: static float16 shapes, the onnxnorm nodes its config
    expects (with bodies), and on the CPU provider with the library, bound to host buffers and
    profiled, each of them ran its kernel, no Memcpy node ran, and the outputs are the float32
    eager model's within the decoder's float16 tolerance."""
    torch = pytest.importorskip("torch")
    decoder = _decoder()
    model = onnx.load_from_string(decoder.model)
    nodes = collections.Counter(n.op_type for n in model.graph.node if n.domain == ops.DOMAIN)
    assert nodes == decoder.expected == collections.Counter({"RMSNorm": 1, "SkipRMSNorm": 4})
    assert {(f.domain, f.name) for f in model.functions} == {
        (ops.DOMAIN, "RMSNorm"),
        (ops.DOMAIN, "SkipRMSNorm"),
    }
    for value in [*model.graph.input, *model.graph.output]:
        tensor = value.type.tensor_type
        assert tensor.elem_type == onnx.TensorProto.FLOAT16, value.name
        assert [d.dim_value for d in tensor.shape.dim] == [1, 8, 64], value
    x = _hidden_states(decoder.shape, seed=1)
    sess = runtime.session(decoder.model, _profiling(tmp_path))
    (got,) = _bound_runs(sess, [x], "cpu")
    kernels = _kernels(sess)
    _check_decoder_kernels(kernels, decoder.expected, CPU)
    assert _compute_on_cpu(kernels)  # (all of it, here: the classifier sees float16 kernels)
    with torch.no_grad():
        want = decoder.eager(torch.from_numpy(x.astype(np.float32))).numpy()
    assert got[0].dtype == np.float16
    np.testing.assert_allclose(got[0].astype(np.float32), want, DECODER_RTOL, DECODER_ATOL)


@needs_library
def test_bound_runs_follow_new_inputs_in_fixed_buffers_on_cpu():
    """The CUDA graph test's runs on the CPU provider: new values copied into the same bound
    input buffer give each run that input's outputs (a plain run's), in the same output
    buffers."""
    decoder = _decoder()
    feeds = [_hidden_states(decoder.shape, seed) for seed in range(10, 13)]
    sess = runtime.session(decoder.model)
    name = sess.get_inputs()[0].name
    want = [sess.run(None, {name: x}) for x in feeds]
    got = _bound_runs(sess, feeds, "cpu")
    assert not np.allclose(got[0][0], got[1][0])
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(
            g[0].astype(np.float32), w[0].astype(np.float32), *ops.reference.tolerance(np.float16)
        )


@pytest.mark.parametrize("op, attrs", _body_cases())
def test_function_body_fallback_in_bfloat16_on_cpu(op, attrs, tmp_path):
    """The bfloat16 one-node models of the GPU test through their bodies on ORT's CPU provider
    (no library): the reference's values, the body's ops ran (not the op), on the CPU, and the
    profile classifier sees the body's floating-point kernels there."""
    arrays = _bf16_arrays(op)
    sess = runtime.session(_body_model(op, arrays, attrs), _profiling(tmp_path), with_library=False)
    got = run_session(sess, arrays)
    _check_against_reference(op, arrays, attrs, got)
    kernels = _kernels(sess)
    assert kernels and op not in {k.op for k in kernels}, _body_placement(kernels, op)
    assert {k.provider for k in kernels} == {CPU}
    compute = _compute_on_cpu(kernels)
    assert any(k.op == "Cast" and "bfloat16" in k.types for k in compute), compute
    assert not _memcpy(kernels)
    report = _body_placement(kernels, op)
    assert all(f"{k} on {CPU}" in report for k in kernels), report


def test_verdicts_of_float16_results():
    want = np.array([[1.0, -2.0], [0.5, 3.0]], np.float32)
    assert _verdict(want.astype(np.float16), want) == "right"
    assert _verdict(np.zeros((2, 2), np.float16), want) == "zeros"
    assert _verdict(np.full((2, 2), np.inf, np.float16), want) == "Inf"
    assert _verdict(np.full((2, 2), np.nan, np.float16), want) == "NaN"
    mixed = np.array([[0, np.inf], [np.nan, 3.0]], np.float16)
    assert _verdict(mixed, want) == ("wrong (1 zeros, 1 Inf, 1 NaN of 4; largest finite error 1)")
    assert _far(mixed, want) and _far(np.zeros(4), want.ravel())
    assert not _far(want.astype(np.float16), want)


@pytest.mark.parametrize("norm", ["rms", "layer"])
def test_float16_activations_over_256_on_cpu(norm, tmp_path):
    """The GPU test's models on the CPU provider. The decomposed norm in float32 is onnxnorm's
    reference; its premise holds in numpy's float16 (x * x is Inf, the norm comes out zeros);
    onnxnorm's function body (no library) and, where built, the fused op return the float32
    values within 1e-3. What ORT's CPU provider makes of the float16 decomposed graph is
    printed: it runs float16 ops without a float16 kernel in float32 (casts it inserts), which
    can hide the overflow."""
    x, scale = _large_activations()
    with np.errstate(over="ignore"):
        assert np.isinf(x * x).all()
    want = _float32_result(norm, x, scale)
    op = _fused_op(norm)
    reference = ops.reference.run(op, x.astype(np.float32), scale.astype(np.float32), epsilon=EPS)
    np.testing.assert_allclose(want, reference[0], rtol=1e-5, atol=1e-5)
    # the float16 graph op by op in numpy's float16
    with np.errstate(over="ignore"):
        h = x - x.mean(-1, keepdims=True, dtype=np.float16) if norm == "layer" else x
        std = np.sqrt(np.mean(h**2, -1, keepdims=True, dtype=np.float16) + np.float16(EPS))
        assert _verdict(h / std * scale, want) == "zeros"
    y, kernels = _run_decomposed(norm, x, scale, [CPU], False, tmp_path)
    print(f"decomposed float16 {norm} norm on the CPU: {_verdict(y, want)} [ran: {_ran(kernels)}]")
    assert {k.op for k in kernels} >= {"Pow", "ReduceMean", "Sqrt", "Div"}
    arrays = {"X": x, "Scale": scale}
    body_model = single_node_model(op, arrays, _FUSED_ATTRS)
    body = runtime.session(body_model, with_library=False)
    got = body.run(None, {"x": x, "scale": scale})[0]
    assert _verdict(got, want) == "right"
    if not _library_built():
        pytest.skip("the onnxnorm library is not built (the fused op on the CPU)")
    fused = single_node_model(op, arrays, _FUSED_ATTRS, functions=False)
    sess = runtime.session(fused, _profiling(tmp_path))
    got = sess.run(None, {"x": x, "scale": scale})[0]
    assert [(k.op, k.provider) for k in _kernels(sess)] == [(op, CPU)]
    assert _verdict(got, want) == "right"
