"""The `vllm` lab backend: real vLLM on a GPU worker (see backend.py), measured over HTTP."""

from labs.backends.vllm.backend import VLLMBackend

__all__ = ["VLLMBackend"]
