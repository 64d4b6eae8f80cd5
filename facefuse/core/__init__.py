"""Core: error types, input limits, the tensor contract, metric names, sample photos.

Imports nothing else from facefuse: every other layer may import it.
"""
