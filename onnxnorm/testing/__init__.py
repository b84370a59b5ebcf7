"""Fixtures shared by onnxnorm's benchmarks, its tests and the scripts of ``models/``: not part of
the library's API for converting, exporting or fusing models, and free to change with them.

- :mod:`onnxnorm.testing.hf`: tiny random-weight Hugging Face models built from configs in code
  (nothing is downloaded) and what is made from them: norm weights randomized, the KV-cache
  export, a word-level tokenizer for a saved checkpoint, onnxruntime-genai's model builder,
  ONNX Runtime's quantization.

Importing this package, or :mod:`onnxnorm.testing.hf`, loads none of torch, transformers,
onnxruntime-genai or onnxruntime's quantization tools: each function imports what it uses.
"""
