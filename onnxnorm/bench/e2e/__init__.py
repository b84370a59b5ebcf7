"""``onnxnorm bench e2e``: greedy generation with a KV cache, as users run a decoder, for every
way of getting its norms into ONNX Runtime.

A Llama-style decoder (``LlamaForCausalLM``) and a Gemma-2-style sandwich decoder
(``Gemma2ForCausalLM``) are built from configs in code with seeded random weights (nothing is
downloaded; the vocabulary is small, see :class:`Config`) and exported by
``torch.onnx.export(dynamo=True)`` with their past keys and values as inputs and the present
ones as outputs. Each variant of the model then generates ``new_tokens`` tokens after a
``prompt``-token prompt, greedily (numpy argmax), through one loop that is the same for every
variant:

- ``export``: the exported model as it is;
- ``ort-optimizer``: ONNX Runtime's transformers optimizer (``optimize_model``);
- ``onnxscript``: onnxscript's ``ort_fusions.optimize_for_ort``;
- ``onnxnorm-ort``: ``onnxnorm fuse --target ort`` (ONNX Runtime's own norm ops);
- ``onnxnorm-fused``: ``onnxnorm fuse --target fused``, run with the onnxnorm library;
- ``onnxnorm-export``: ``onnxnorm.export(model, ..., mode="fused", convert=True)`` from the
  torch model, run with the onnxnorm library.

The loop runs the prompt once (the prefill, which yields the first token), then one token at a
time, binding the present keys and values the last run returned (ORT's own buffers, through IO
binding, never copied) as the next run's past. All variants run in one process, ``repeats``
times, their sessions opened anew each time in a shuffled order, and generate in lockstep (step
k of every variant before step k + 1 of any, in a shuffled order; genai's by whole
generations), every step timed; beside them a second session of the group's first variant (the
control) shows what the timing's own noise is. Apart from the timed runs, one profiled
generation per variant (ORT's profiler) gives the share of node time spent in norm kernels,
and one generation per variant in a fresh interpreter gives its peak resident memory.

The same is measured through onnxruntime-genai: its model builder's folders (fp32 and int4)
of the same configs before and after ``onnxnorm genai``, generating with genai's own loop.

With ``--quantize dynamic,static`` the exported decoder is quantized by ONNX Runtime's own
tools (``quantize_dynamic``, and ``quantize_static`` in QDQ format calibrated on a few
generated prompts; the MatMuls only, as a user quantizes a decoder), and each quantized model
is measured by the same loop as it is, after ORT's transformers optimizer, and after ``onnxnorm
fuse --target ort`` / ``--target fused``, which turns each norm and the quantizer after it into
one quantized onnxnorm op (``RMSNormDynamicQuantizeLinear``, ``SkipRMSNormQuantizeLinear``, ...).

With ``--runtime ort,openvino,tract,...`` it measures, instead, on each runtime the export as it
is against onnxnorm's output written ``--for`` that runtime (``onnxnorm.fusion.lowering.lower(
..., runtime=...)``) and the function file, run through :mod:`onnxnorm.deploy.runners` on the same
inputs: a prefill and one decode step, single forward runs (``runtimes``).

The benchmark is this package's modules, each of one concern: ``config`` (what is measured, the
sizes), ``models`` (the decoders and their exports), ``variants`` (the models each tool makes),
``generation`` (the ORT loop), ``genai`` (onnxruntime-genai's folders and loop), ``profiling``
(norm share), ``memory`` (peak memory), ``groups`` (a group timed and judged), ``report``
(tables, plot, JSON), ``runner`` (every group), ``runtimes`` (``--runtime``: the export against
onnxnorm's output on each runtime, its table and JSON) and ``cli`` (the command). Their public names
are this package's too, imported on first use. The Hugging Face models, their KV-cache export,
tokenizer, model-builder call and quantization are the fixtures the tests use too,
:mod:`onnxnorm.testing.hf`.
"""

from onnxnorm import _lazy
from onnxnorm.bench.common import quietly  # noqa: F401 - a public name of this package

#: public name -> the module of this package that defines it
_WHERE = {
    **dict.fromkeys(
        (
            "FAMILIES",
            "DEFAULT_FAMILIES",
            "DTYPES",
            "VARIANTS",
            "DEFAULT_VARIANTS",
            "ONNXNORM_VARIANTS",
            "GENAI_PRECISIONS",
            "GENAI_VARIANTS",
            "DEVICES",
            "QUANTIZATIONS",
            "QUANT_VARIANTS",
            "QUANT_ONNXNORM_VARIANTS",
            "CALIBRATION_PROMPTS",
            "QUANTIZERS",
            "RUNTIME_RUNNERS",
            "PROFILED_TOKENS",
            "NORM_CLASSES",
            "Config",
            "STAMP",
            "stamp",
            "check_keep",
        ),
        "config",
    ),
    **dict.fromkeys(("hf_config", "hf_model", "export", "export_onnxnorm"), "models"),
    **dict.fromkeys(
        (
            "NORM_OPS",
            "make_variants",
            "calibration_feeds",
            "quantize",
            "make_quantized",
            "quantized_variants",
            "node_counts",
            "norm_node_names",
        ),
        "variants",
    ),
    **dict.fromkeys(("Generator", "collect"), "generation"),
    **dict.fromkeys(("genai_folders", "GenaiGenerator"), "genai"),
    **dict.fromkeys(("norm_share", "profile_ort", "profile_genai"), "profiling"),
    **dict.fromkeys(("peak_memory", "memory_child"), "memory"),
    **dict.fromkeys(
        (
            "Row",
            "CONTROL",
            "interleave",
            "paired",
            "gains",
            "noise",
            "verdict",
            "run_group",
            "ort_group",
            "quantized_group",
            "genai_group",
        ),
        "groups",
    ),
    **dict.fromkeys(("environment", "markdown", "overview", "plot", "write_json"), "report"),
    **dict.fromkeys(
        (
            "make_runtime_models",
            "runtime_feeds",
            "runtime_row",
            "runtime_group",
            "runtimes_markdown",
            "run_runtimes",
        ),
        "runtimes",
    ),
    "run": "runner",
    "register": "cli",
}

__getattr__, __dir__ = _lazy.names(__name__, _WHERE, globals())
