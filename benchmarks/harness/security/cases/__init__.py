"""Attack cases of the security bench, one module per area; every module here is imported by the registry."""
