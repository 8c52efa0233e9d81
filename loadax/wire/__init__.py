"""Wire formats shared by the worker and the client."""
