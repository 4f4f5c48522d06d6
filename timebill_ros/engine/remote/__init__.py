"""The remote backend: goals served by an existing engine over its OpenAI-compatible API."""
