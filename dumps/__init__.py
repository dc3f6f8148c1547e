"""Bundled example dumps (.mlir + sidecar .json), installed as package data.

Reach them from any directory through :func:`hlo_trace.examples.example_dump`.
"""
