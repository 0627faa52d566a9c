"""Small template filters for the console: dictionary lookup and percentages."""

from django import template

register = template.Library()


@register.filter
def get_item(mapping, key):
    try:
        return mapping.get(key, 0)
    except AttributeError:
        return 0


@register.filter
def pct(value, digits: int = 1):
    if value is None:
        return "–"
    return f"{value * 100:.{digits}f}%"


@register.filter
def mu(value):
    if value is None:
        return "–"
    return f"{value:,.1f}"
