"""Engines: what runs a batch on a GPU (vLLM), on someone's endpoint (openai) or simulated (sim)."""
