"""The security bench: named attack cases run against the real platform (see ``benchmarks.harness.security.registry``)."""
