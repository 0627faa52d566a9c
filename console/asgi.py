"""The platform's ASGI application plus the console's static files, for a single-process run and browser tests.

``uvicorn console.asgi:application`` serves CSS/JS itself (Django's staticfiles finders, no collectstatic);
a production deployment serves the collected static files from its web server and runs ``config.asgi``.
"""

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

from config.asgi import application as platform_application

application = ASGIStaticFilesHandler(platform_application)
