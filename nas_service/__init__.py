"""The depthscope service: job storage, the search runner, the HTTP API and the CLI."""
