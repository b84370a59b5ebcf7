"""PyTorch side: norm modules, the catalogue ops as torch custom ops, export."""

from onnxnorm.nn.functional import TRANSLATION_TABLE, call
from onnxnorm.nn.export import export
from onnxnorm.nn.modules import RMSNorm

__all__ = ["RMSNorm", "TRANSLATION_TABLE", "call", "export"]
