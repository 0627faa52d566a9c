"""``python manage.py create_operator --username NAME [--email ADDRESS]``: the first operator of a new installation
(and any later one), through the same service as the REST API, audited. The password comes from
``INFERCAP_OPERATOR_PASSWORD`` when set (a Secret, a CI variable), else a random one is printed once."""

import os
import secrets

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from tenants.models import Role, User
from tenants.services import user_create

PASSWORD_ENV = "INFERCAP_OPERATOR_PASSWORD"


class Command(BaseCommand):
    help = "Create an operator account (its password from INFERCAP_OPERATOR_PASSWORD, else generated and printed)."

    def add_arguments(self, parser):
        parser.add_argument("--username", required=True)
        parser.add_argument("--email", default="")
        parser.add_argument(
            "--if-missing", action="store_true", help="succeed without change when the user already exists"
        )

    def handle(self, *args, username: str, email: str, if_missing: bool, **options):
        if User.objects.filter(username=username).exists():
            if if_missing:
                self.stdout.write(f"operator {username} already exists")
                return
            raise CommandError(f"user {username!r} already exists")
        given = os.environ.get(PASSWORD_ENV, "")
        password = given or secrets.token_urlsafe(18)
        try:
            user_create(username=username, email=email, role=Role.OPERATOR, tenant=None, password=password)
        except ValidationError as exc:
            raise CommandError("; ".join(m for messages in exc.message_dict.values() for m in messages)) from exc
        self.stdout.write(f"created operator {username}")
        if not given:
            self.stdout.write(f"password (shown once): {password}")
