"""The REST API's filter backend: ``filterset_fields`` as django-filter builds them, foreign keys by plain id.

Kept apart from tenants.api.base: DRF reads this setting while defining its generic views, so this module
must not import them.
"""

import django_filters
from django import forms
from django.db import models
from django_filters.rest_framework import DjangoFilterBackend, FilterSet


class IdFilter(django_filters.Filter):
    field_class = forms.IntegerField


class ScopedFilterSet(FilterSet):
    """Foreign keys in ``filterset_fields`` filter by plain id.

    django-filter's default checks the id against every row of the related model, so another tenant's
    id answered 200 (empty) while a missing one answered 400: a way to learn which tenants and private
    endpoints exist. The scoped queryset already hides other tenants' rows, so any id simply matches nothing.
    """

    FILTER_DEFAULTS = {
        **FilterSet.FILTER_DEFAULTS,
        models.ForeignKey: {"filter_class": IdFilter},
        models.OneToOneField: {"filter_class": IdFilter},
    }


class ScopedFilterBackend(DjangoFilterBackend):
    filterset_base = ScopedFilterSet
