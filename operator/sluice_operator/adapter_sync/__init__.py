"""Keeping the running replicas' LoRA adapters equal to the spec: a pure plan beside the runtime API calls."""
from .plan import Step, plan
from .runtime_api import RuntimeApiError, adapters_loaded, load_adapter, unload_adapter

__all__ = ["RuntimeApiError", "Step", "adapters_loaded", "load_adapter", "plan", "unload_adapter"]
