"""GPU fixtures (filled in by the GPU backend)."""
