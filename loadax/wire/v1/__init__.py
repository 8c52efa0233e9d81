"""Version 1 of the worker protocol (generated from proto/; see `make proto`)."""
