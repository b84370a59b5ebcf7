"""Reference transformer blocks used by the tests, the demo and the benchmarks.

- ``models.decoder``: a small configurable decoder (RMSNorm or LayerNorm; Pre-, Post-,
  Sandwich-Norm, DeepNorm, OLMo 2's reordered norms; Gemma's scale offset; Q/K and embedding
  norms), as onnxnorm modules with fused residual adds or as decomposed torch math;
- ``models.families``: the norm configurations of LLM families, as data;
- ``models.llama``: a Llama-style decoder written the way Hugging Face writes Llama;
- ``models.docs``: renders docs/norms.md; ``models.demo``: the demo.
"""
