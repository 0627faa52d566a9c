"""Create the demo world (idempotent): an operator, tenant "demo" with an admin and a fresh API key,
a simulated 13B endpoint with a reservation and SLOs. Prints the logins and the key (shown once)."""

import json
import os

from django.core.management.base import BaseCommand
from django.db import transaction
from django.utils import timezone

from billing.models import SLO, SLIKind
from capacity.services import simulated_profiles_get_or_create
from endpoints.models import Endpoint, Runtime
from tenants.models import ApiKey, CapacityReservation, PriorityClass, Role, Tenant, User
from tenants.services import api_key_create, api_key_revoke

DEMO_KEY_NAME = "demo key"


class Command(BaseCommand):
    help = "Create or refresh the demo tenant, users, endpoint and API key."

    def add_arguments(self, parser):
        parser.add_argument("--endpoint", default="demo-chat")
        parser.add_argument("--replicas", type=int, default=2)
        parser.add_argument(
            "--json", dest="as_json", action="store_true", help="print the result as JSON (for scripts)"
        )

    @transaction.atomic
    def handle(self, *args, endpoint: str, replicas: int, as_json: bool = False, **options):
        password = os.environ.get("INFERCAP_DEMO_PASSWORD", "infercap-demo")
        hardware, model = simulated_profiles_get_or_create()
        operator = self._user("admin", password, role=Role.OPERATOR, tenant=None, is_staff=True, is_superuser=True)
        tenant, _ = Tenant.objects.get_or_create(slug="demo", defaults={"name": "Demo tenant"})
        self._user("demo", password, role=Role.TENANT_ADMIN, tenant=tenant)
        ep, _ = Endpoint.objects.get_or_create(
            name=endpoint,
            defaults=dict(
                model_profile=model,
                hardware_profile=hardware,
                runtime=Runtime.SIM,
                min_replicas=replicas,
                desired_replicas=replicas,
                max_replicas=max(4, replicas),
                concurrency_limit=64,
                launch_options={"speed": 1.0},
            ),
        )
        CapacityReservation.objects.get_or_create(
            tenant=tenant, endpoint=ep, defaults={"mu_per_min": 600.0, "priority": PriorityClass.STANDARD}
        )
        SLO.objects.get_or_create(
            name=f"{ep.name} availability", endpoint=ep, defaults={"sli": SLIKind.AVAILABILITY, "objective": 0.999}
        )
        SLO.objects.get_or_create(
            name=f"{ep.name} goodput", endpoint=ep, defaults={"sli": SLIKind.GOODPUT, "objective": 0.99}
        )
        # A key is shown once: each run revokes the previous demo key and prints a new one.
        for old in ApiKey.objects.filter(tenant=tenant, name=DEMO_KEY_NAME, revoked_at__isnull=True):
            api_key_revoke(api_key=old, actor=operator)
        _, raw_key = api_key_create(
            tenant=tenant,
            name=DEMO_KEY_NAME,
            scopes=["inference", "read", "write"],
            max_priority=PriorityClass.CRITICAL,
            actor=operator,
        )
        result = {
            "operator": "admin",
            "tenant_admin": "demo",
            "password": password,
            "endpoint": ep.name,
            "api_key": raw_key,
            "created_at": timezone.now().isoformat(),
        }
        if as_json:
            self.stdout.write(json.dumps(result))
        else:
            self.stdout.write(
                f"operator login: admin / {password}\ntenant login:   demo / {password}\n"
                f"endpoint:       {ep.name}\nAPI key:        {raw_key}  (shown once)\n"
            )
        return None

    def _user(self, username: str, password: str, **fields) -> User:
        user, created = User.objects.get_or_create(username=username, defaults=fields)
        if created or not user.has_usable_password():
            user.set_password(password)
            user.save()
        return user
