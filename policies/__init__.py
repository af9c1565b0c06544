"""Data policies: signals in, token weights or domain proportions out (pure torch/numpy).

See docs/architecture.md for the contract and DESIGN §3-§4 for the semantics.
"""

from .batch import RolloutBatch
from .mixers import Mixer
from .params import LessThan, Param, ParamSpec
from .registry import (
    ALL_METHODS,
    PAPER_METHODS,
    Policy,
    PolicyResult,
    arm_key,
    canonical_params,
    describe_method,
    make_mixer,
    make_policy,
    methods_table,
    resolve,
    suggest_params,
    tune_space,
    validate_params,
)
from .sampler import DomainSampler, SamplerDraw, largest_remainder

__all__ = [
    "ALL_METHODS",
    "PAPER_METHODS",
    "DomainSampler",
    "LessThan",
    "Mixer",
    "Param",
    "ParamSpec",
    "Policy",
    "PolicyResult",
    "RolloutBatch",
    "SamplerDraw",
    "arm_key",
    "canonical_params",
    "describe_method",
    "largest_remainder",
    "make_mixer",
    "make_policy",
    "methods_table",
    "resolve",
    "suggest_params",
    "tune_space",
    "validate_params",
]
