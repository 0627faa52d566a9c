"""API-wide behaviour: every error is JSON with field messages, never an HTML 500 page."""

import logging

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

logger = logging.getLogger("infercap.api")


def exception_handler(exc, context):
    if isinstance(exc, DjangoValidationError):
        detail = exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        exc = ValidationError(detail=detail)
    elif isinstance(exc, IntegrityError):
        logger.info("integrity error turned into 400: %s", exc)
        return Response(
            {"non_field_errors": ["conflicts with an existing object"]}, status=status.HTTP_400_BAD_REQUEST
        )
    return drf_exception_handler(exc, context)
