"""Serving: ``simpop serve``, an OpenAI-compatible HTTP API (FastAPI + uvicorn) over any backend.

:mod:`simpop.serve.server` (routes, responses, lifecycle, CLI), :mod:`simpop.serve.requests` (request models,
limits), :mod:`simpop.serve.http` (connection guards) and :mod:`simpop.serve.batching` (micro-batching).
"""
