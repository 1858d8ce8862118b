"""fabricctl: a shape-aware broker, GPU supervisor and live dashboard for LLM batch inference."""

__version__ = "0.1.0"
