"""Model collections and scripts used by the tests, the demo and the docs.

They import onnxnorm like any user; nothing in the onnxnorm package imports them. The
configurable decoder and the LLM families' norm table that ``onnxnorm export FAMILY`` builds live
in the package (``onnxnorm.nn.decoder``, ``onnxnorm.nn.families``), and so do the tiny Hugging
Face models, their KV-cache export, tokenizer, model-builder call and quantization that the
benchmarks share with these (``onnxnorm.testing.hf``).

- ``models.corpus``: the fusion corpus (tiny random-weight transformers models and decomposed
  decoder blocks) for the corpus tests; ``models.compare``: onnxnorm's fusion against other
  tools on that corpus, which writes docs/fusion.md;
- ``models.pipelines``: models as deployment tools make them (onnxruntime-genai's builder,
  ORT's quantization, float16 converters and optimizer, onnxsim, onnxslim, KV-cache exports)
  for the pipeline tests, and the writer of docs/pipelines.md;
- ``models.demo``: the demo.

docs/norms.md is written by tools/gen_norms_doc.py (``make generate``).
"""
