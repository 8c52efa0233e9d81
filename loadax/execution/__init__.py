"""Execution: a pipeline, and the executors that load its work inline, on threads, in processes."""
