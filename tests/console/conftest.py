from tests.console.browser import chromium, console_server, page  # noqa: F401  (browser fixtures)
