"""The loadax worker: serves batches of configured pipelines over gRPC and ZeroMQ."""
