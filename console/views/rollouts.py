"""Endpoint versions and rollouts in the console: the history and progress shown on the endpoint page, and the
operator actions (start, pause, resume, promote, roll back), each confirmed first and audited by the services."""

from django.http import Http404
from django.shortcuts import get_object_or_404, render
from django.urls import reverse

from console.access import endpoint_for, operator_required
from console.actions import rollout_control_action, rollout_start_action
from console.forms import RolloutActionForm, RolloutStartForm
from console.views.common import confirm_then_run
from endpoints.models import Endpoint, Rollout, RolloutState

VERSIONS_SHOWN = 10
EVENTS_SHOWN = 30
ACTION_TITLES = {
    "pause": "Pause",
    "resume": "Resume",
    "promote": "Promote",
    "rollback": "Roll back",
}
ACTION_HELP = {
    "pause": "Nothing is started or drained and traffic stays split as it is until you resume.",
    "resume": "The rollout continues from where it was paused; a canary step is observed afresh.",
    "promote": "Skips the remaining canary steps: traffic follows the new replicas as they warm up; the old version drains.",
    "rollback": "Traffic returns to the old version and the new version's replicas drain.",
}
# Which actions make sense in which state (the services refuse the others with a reason anyway).
ACTIONS_BY_STATE = {
    RolloutState.PENDING: ("pause", "promote", "rollback"),
    RolloutState.SURGING: ("pause", "promote", "rollback"),
    RolloutState.SHIFTING: ("pause", "promote", "rollback"),
    RolloutState.PAUSED: ("resume", "promote", "rollback"),
}


def rollout_panel(*, endpoint: Endpoint, user) -> dict | None:
    """Version history and the latest rollout with its decisions, for the endpoint page (operators and the
    endpoint's owner; None for a tenant that only reserves on a shared endpoint)."""
    if not (user.is_operator or (endpoint.owner_tenant_id and endpoint.owner_tenant_id == user.tenant_id)):
        return None
    versions = list(
        endpoint.versions.select_related("model_profile", "hardware_profile", "created_by")[:VERSIONS_SHOWN]
    )
    rollout = (
        Rollout.objects.filter(endpoint=endpoint).select_related("from_version", "to_version", "created_by").first()
    )
    events = list(rollout.events.order_by("-at", "-id")[:EVENTS_SHOWN]) if rollout else []
    actions = ACTIONS_BY_STATE.get(rollout.state, ()) if rollout and user.is_operator else ()
    return {
        "versions": versions,
        "current_version_id": endpoint.current_version_id,
        "rollout": rollout,
        "events": events,
        "actions": [(name, ACTION_TITLES[name]) for name in actions],
        "can_start": user.is_operator and (rollout is None or not rollout.is_active),
    }


@operator_required
def rollout_start_view(request, endpoint_id: int):
    endpoint = endpoint_for(request.user, endpoint_id)
    context = {"endpoint": endpoint}
    if request.method != "POST":
        return render(request, "console/rollout_form.html", {**context, "form": RolloutStartForm(endpoint=endpoint)})
    form = RolloutStartForm(request.POST, endpoint=endpoint)
    version = form.cleaned_data.get("to_version") if form.is_valid() else None
    what = f"v{version.number}" if version else "a new version"
    return confirm_then_run(
        request,
        form=form,
        template="console/rollout_form.html",
        context=context,
        title=f"Roll out {endpoint.name}",
        summary=(
            f"Roll {endpoint.name} out to {what} ({form.data.get('strategy', '')})? "
            "New replicas start next to the old ones and take traffic once healthy and warmed up; the old ones "
            "drain after. Failing health or a worse canary rolls it back automatically."
        ),
        run=lambda: rollout_start_action(endpoint=endpoint, form_data=form.cleaned_data, actor=request.user),
        success_message=lambda r: f"Rollout to v{r.to_version.number} started.",
        success_url=reverse("console:endpoint", args=[endpoint.pk]),
    )


@operator_required
def rollout_action_view(request, endpoint_id: int, rollout_id: int, action: str):
    if action not in ACTION_TITLES:
        raise Http404("No such action")
    endpoint = endpoint_for(request.user, endpoint_id)
    rollout = get_object_or_404(
        Rollout.objects.select_related("from_version", "to_version"), pk=rollout_id, endpoint=endpoint
    )
    title = f"{ACTION_TITLES[action]} the rollout of {endpoint.name}"
    context = {"endpoint": endpoint, "rollout": rollout, "action": action, "title": title, "help": ACTION_HELP[action]}
    if request.method != "POST":
        return render(request, "console/rollout_action_form.html", {**context, "form": RolloutActionForm()})
    form = RolloutActionForm(request.POST)
    return confirm_then_run(
        request,
        form=form,
        template="console/rollout_action_form.html",
        context=context,
        title=title,
        summary=(
            f"{ACTION_TITLES[action]} the rollout v{rollout.from_version.number} → v{rollout.to_version.number} "
            f"(now {rollout.get_state_display().lower()}, {rollout.traffic_percent}% on the new version)? "
            f"{ACTION_HELP[action]}"
        ),
        run=lambda: rollout_control_action(
            rollout=rollout, action=action, actor=request.user, reason=form.cleaned_data["reason"]
        ),
        success_message=lambda r: f"Rollout {r.get_state_display().lower()}.",
        success_url=reverse("console:endpoint", args=[endpoint.pk]),
    )
