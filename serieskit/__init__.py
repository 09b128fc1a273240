"""Toolkit that carries the Turing / no-P2P prefill series as patches on vLLM."""
