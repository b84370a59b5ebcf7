"""Model corpora and model builders used by the tests, the demo and the docs (models/README.md
says what each module holds and who uses it).

They import onnxnorm like any user; nothing in the onnxnorm package imports them. The
configurable decoder and the LLM families' norm table that ``onnxnorm export FAMILY`` builds live
in the package (``onnxnorm.nn.decoder``, ``onnxnorm.nn.families``), and so do the tiny Hugging
Face models, their KV-cache export, tokenizer, model-builder call and quantization that the
benchmarks share with these (``onnxnorm.testing.hf``).

- ``models.corpus``: the fusion corpus (tiny random-weight transformers models and decomposed
  decoder blocks) and the larger decoder the pass is timed on;
- ``models.compare``: ONNX Runtime's transformers optimizer and onnxscript's ort_fusions run on
  a model, its single norm ops counted, parity checked;
- ``models.pipelines``: models as deployment tools make them (onnxruntime-genai's builder,
  ORT's quantization, float16 converters and optimizer, onnxsim, onnxslim, KV-cache exports,
  Optimum folders through ``models.optimum_export``);
- ``models.wild``: hand-built ONNX files of older opsets and sloppy metadata;
- ``models.demo``: the demo.

The measured pages are written by tools/fusion_page.py (docs/fusion.md) and
tools/pipelines_page.py (docs/pipelines.md); docs/norms.md by tools/gen_norms_doc.py
(``make generate``).
"""
