"""Data policies: signals in, token weights or domain proportions out (pure torch/numpy).

See docs/architecture.md for the contract and DESIGN §3-§4 for the semantics.
"""

from tune_dfrl.config.constraints import Bound, Context, Interval, ListOf, Options

from .batch import RolloutBatch
from .mixers import Mixer
from .params import LessThan, Param, ParamSpec
from .registry import (
    ALL_METHODS,
    PAPER_METHODS,
    UNIFORM,
    Policy,
    PolicyResult,
    arm_key,
    canonical_arm,
    describe_method,
    make_mixer,
    make_policy,
    methods_table,
    resolve,
    suggest_params,
    validate_params,
)
from .sampler import DomainSampler, SamplerDraw, largest_remainder

__all__ = [
    "ALL_METHODS",
    "PAPER_METHODS",
    "UNIFORM",
    "Bound",
    "Context",
    "DomainSampler",
    "Interval",
    "LessThan",
    "ListOf",
    "Mixer",
    "Options",
    "Param",
    "ParamSpec",
    "Policy",
    "PolicyResult",
    "RolloutBatch",
    "SamplerDraw",
    "arm_key",
    "canonical_arm",
    "describe_method",
    "largest_remainder",
    "make_mixer",
    "make_policy",
    "methods_table",
    "resolve",
    "suggest_params",
    "validate_params",
]
