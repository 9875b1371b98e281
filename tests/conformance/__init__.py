"""Conformance tests: our contract checked the way vLLM tests its own samplers."""
