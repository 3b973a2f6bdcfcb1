"""Backbones and heads: EquiformerV2 with an EST-replaceable update block."""
from .backbone import EquiformerV2Backbone
from .config import ESTOptions, GridOptions, ModelConfig
from .heads import DirectForceHead, ScalarHead
from .model import EquiformerV2
from .registry import MODEL_CONFIGS, build_model, list_models, model_config

__all__ = [
    "EquiformerV2",
    "EquiformerV2Backbone",
    "ModelConfig",
    "ESTOptions",
    "GridOptions",
    "ScalarHead",
    "DirectForceHead",
    "MODEL_CONFIGS",
    "build_model",
    "list_models",
    "model_config",
]
