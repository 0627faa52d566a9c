"""Console URL map, mounted at /console/."""

from django.urls import path

from console.views import (
    adapters,
    audit,
    fleet,
    operations,
    planner,
    planner_apply,
    planner_mix,
    planner_pd,
    rollouts,
    tenant,
)

app_name = "console"

urlpatterns = [
    path("", fleet.home, name="home"),
    path("fleet/", fleet.fleet, name="fleet"),
    path("endpoints/new/", fleet.endpoint_create_view, name="endpoint-create"),
    path("endpoints/<int:endpoint_id>/", fleet.endpoint_detail, name="endpoint"),
    path("endpoints/<int:endpoint_id>/scale/", fleet.endpoint_scale_view, name="endpoint-scale"),
    path("endpoints/<int:endpoint_id>/unpin/", fleet.endpoint_unpin_view, name="endpoint-unpin"),
    path(
        "endpoints/<int:endpoint_id>/replicas/<int:replica_id>/drain/", fleet.replica_drain_view, name="replica-drain"
    ),
    path("endpoints/<int:endpoint_id>/replicas/attach/", fleet.replica_attach_view, name="replica-attach"),
    path("endpoints/<int:endpoint_id>/rollouts/new/", rollouts.rollout_start_view, name="rollout-start"),
    path(
        "endpoints/<int:endpoint_id>/rollouts/<int:rollout_id>/<slug:action>/",
        rollouts.rollout_action_view,
        name="rollout-action",
    ),
    path("tenants/", operations.tenants, name="tenants"),
    path("brownout/", operations.brownout, name="brownout"),
    path("reservations/new/", operations.reservation_sell_view, name="reservation-sell"),
    path("slos/", operations.slos, name="slos"),
    path("alerts/<int:alert_id>/ack/", operations.alert_ack_view, name="alert-ack"),
    path("cost/", operations.cost, name="cost"),
    path("planner/", planner.planner_view, name="planner"),
    path("planner/apply/<int:endpoint_id>/", planner_apply.planner_apply_view, name="planner-apply"),
    path("planner/mix/", planner_mix.planner_mix_view, name="planner-mix"),
    path("planner/disaggregation/", planner_pd.planner_pd_view, name="planner-pd"),
    path("audit/", audit.audit, name="audit"),
    path("adapters/", adapters.adapters, name="adapters"),
    path("tenant/", tenant.tenant_home, name="tenant-home"),
    path("tenant/keys/", tenant.api_keys, name="api-keys"),
    path("tenant/keys/new/", tenant.api_key_create_view, name="api-key-create"),
    path("tenant/keys/<int:key_id>/revoke/", tenant.api_key_revoke_view, name="api-key-revoke"),
    path("tenant/statement/", tenant.statement, name="statement"),
]
