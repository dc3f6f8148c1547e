"""Parallel strategies for tracing a stage; see :mod:`tracing.strategies.base` to add one."""

from plans.feasibility import Layout, StrategyError
from tracing.strategies import (  # noqa: F401  (register)
    dp,
    ds_ulysses,
    megatron,
    megatron_sp,
    none,
    opensora_sp,
    ring_attention,
    two_dimension,
    usp,
)
from tracing.strategies.base import ALL_DEVICES, Strategy, get_strategy, register, strategy_names

__all__ = ["ALL_DEVICES", "Layout", "Strategy", "StrategyError", "get_strategy", "register",
           "strategy_names"]
