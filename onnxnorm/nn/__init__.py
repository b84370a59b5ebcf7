"""PyTorch side: norm modules, residual blocks fused with their norms, the catalogue ops as torch
custom ops, conversion of existing models, export."""

from onnxnorm.nn.functional import TRANSLATION_TABLE, call
from onnxnorm.nn.modules import LayerNorm, RMSNorm
# the functions shadow their submodules' names: import them here, after the submodules load
from onnxnorm.nn.convert import convert
from onnxnorm.nn.export import export
from onnxnorm.nn.residual import (DeepNormBlock, DeepNormConstants, PostNormBlock, PreNormBlock,
                                  ResidualStream, SandwichBlock, add_norm, deepnorm_constants,
                                  deepnorm_init_, sandwich_norm)


__all__ = ["DeepNormBlock", "DeepNormConstants", "LayerNorm", "PostNormBlock", "PreNormBlock",
           "RMSNorm", "ResidualStream", "SandwichBlock", "TRANSLATION_TABLE", "add_norm", "call",
           "convert", "deepnorm_constants", "deepnorm_init_", "export", "sandwich_norm"]
