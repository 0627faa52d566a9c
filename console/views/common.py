"""Helpers shared by console views: the two-step confirmation every action goes through."""

from collections.abc import Callable

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.shortcuts import redirect, render

from console.actions import ActionRefused


def confirm_then_run(
    request,
    *,
    form,
    template: str,
    context: dict,
    title: str,
    summary: str,
    run: Callable[[], object],
    success_message: str | Callable[[object], str],
    success_url: str | Callable[[object], str],
):
    """Invalid form → the form again with field errors. Valid but unconfirmed → a confirmation page that
    carries the submitted data. Confirmed → run the action; a refusal comes back as a form error."""
    if not form.is_valid():
        return render(request, template, {**context, "form": form}, status=400)
    if request.POST.get("confirmed") != "yes":
        return render(
            request,
            "console/confirm.html",
            {**context, "form": form, "title": title, "summary": summary, "cancel_url": request.path},
        )
    try:
        result = run()
    except (ActionRefused, ValidationError) as exc:
        _attach_errors(form, exc)
        return render(request, template, {**context, "form": form}, status=400)
    message = success_message(result) if callable(success_message) else success_message
    messages.success(request, message)
    return redirect(success_url(result) if callable(success_url) else success_url)


def _attach_errors(form, exc) -> None:
    if isinstance(exc, ValidationError) and hasattr(exc, "error_dict"):
        for field, errors in exc.message_dict.items():
            form.add_error(field if field in form.fields else None, errors)
    else:
        form.add_error(None, exc.messages if isinstance(exc, ValidationError) else str(exc))
