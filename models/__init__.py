"""Reference transformer blocks used by the tests, the demo and the benchmarks.

They import onnxnorm like any user; nothing in the onnxnorm package imports them. The
configurable decoder and the LLM families' norm table that ``onnxnorm export FAMILY`` builds live
in the package (``onnxnorm.nn.decoder``, ``onnxnorm.nn.families``).

- ``models.llama``: a Llama-style decoder written the way Hugging Face writes Llama;
- ``models.corpus``: the fusion corpus (tiny random-weight transformers models and decomposed
  decoder blocks) for the corpus tests; ``models.compare``: onnxnorm's fusion against other
  tools on that corpus, which writes docs/fusion.md;
- ``models.pipelines``: models as deployment tools make them (onnxruntime-genai's builder,
  ORT's quantization, float16 converters and optimizer, onnxsim, onnxslim, KV-cache exports)
  for the pipeline tests, and the writer of docs/pipelines.md;
- ``models.docs``: renders docs/norms.md; ``models.demo``: the demo.
"""
