"""Prompts: the real CLIP tokenizer, token accounting and prompt compression."""
