"""Benchmarks that print numbers (``python -m sglang_rvv.bench SUITE``)."""
