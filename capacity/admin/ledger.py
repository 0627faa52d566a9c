"""Admin: the capacity ledger (have / sold / used per endpoint) with actions to benchmark a replica in a worker."""

from django.contrib import admin, messages
from django.core.exceptions import ValidationError

from capacity.ledger import capacity_ledger
from capacity.models import EndpointCapacity
from capacity.services import benchmark_enqueue
from tenants.admin.base import OperatorAdmin


def _column(name: str, label: str, rows_for, fmt: str = "{:,.1f}"):
    def value(obj):
        row = rows_for().get(obj.pk)
        raw = getattr(row, name, None) if row else None
        return "—" if raw is None else fmt.format(raw)

    value.short_description = label
    return value


@admin.register(EndpointCapacity)
class EndpointCapacityAdmin(OperatorAdmin):
    """Read-only figures; endpoints are edited in their own admin."""

    search_fields = ["name"]
    list_filter = ["hardware_profile", "model_profile"]
    actions = ["benchmark_quick", "benchmark_full"]

    def get_list_display(self, request):
        cache: dict = {}

        def rows_for() -> dict:
            # One ledger computation per page, shared by every column.
            if "rows" not in cache:
                ledger = capacity_ledger(endpoints=EndpointCapacity.objects.all())
                cache["rows"] = {row.endpoint_id: row for row in ledger.endpoints}
            return cache["rows"]

        return [
            "name",
            _column("ready_replicas", "ready", rows_for, "{}"),
            _column("replica_mu_per_min", "MU/min per replica", rows_for),
            _column("have_mu_per_min", "have", rows_for),
            _column("sold_mu_per_min", "sold", rows_for),
            _column("used_mu_per_min_1m", "used 1 min", rows_for),
            _column("used_mu_per_min_1h", "used 1 h", rows_for),
            _column("used_mu_per_min_p95_1d", "used p95 1 d", rows_for),
            _column("headroom_mu_per_min", "headroom", rows_for),
            _column("overcommit_ratio", "sold / have", rows_for, "{:.2f}"),
            _column("coefficients_source", "MU from", rows_for, "{}"),
        ]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def _benchmark(self, request, queryset, *, quick: bool) -> None:
        for endpoint in queryset.select_related("hardware_profile", "model_profile"):
            try:
                benchmark_enqueue(endpoint=endpoint, quick=quick, actor=request.user)
            except ValidationError as exc:
                self.message_user(request, f"{endpoint.name}: {'; '.join(exc.messages)}", messages.WARNING)
            else:
                self.message_user(request, f"{endpoint.name}: benchmark queued; it appears under capacity benchmarks")

    @admin.action(description="Benchmark a ready replica (quick sweep)")
    def benchmark_quick(self, request, queryset):
        self._benchmark(request, queryset, quick=True)

    @admin.action(description="Benchmark a ready replica (full sweep)")
    def benchmark_full(self, request, queryset):
        self._benchmark(request, queryset, quick=False)
