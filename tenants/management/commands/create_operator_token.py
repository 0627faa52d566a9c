"""``python manage.py create_operator_token --username NAME [--scopes read,write,tokens] [--days 30] [--name N]
[--service-account]``: the first operator token of an installation (later ones are minted at /api/v1/operator-tokens/
with a token holding the ``tokens`` scope), through the same audited service. The full token is printed once.
``--service-account`` creates the operator account first when it does not exist, with no password: it can never
log in to the console, only use its tokens (docs/security.md, "Operator tokens")."""

from datetime import timedelta

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from tenants.models import OperatorTokenScope, Role, User
from tenants.operator_tokens import DEFAULT_LIFETIME
from tenants.services import operator_token_create, user_create


class Command(BaseCommand):
    help = "Mint an operator token for the REST API (printed once), for an operator or a new service account."

    def add_arguments(self, parser):
        parser.add_argument("--username", required=True, help="the operator (or service account) it acts as")
        parser.add_argument("--name", default="", help="what the token is for (default: cli)")
        parser.add_argument(
            "--scopes",
            default=",".join(OperatorTokenScope.values),
            help=f"comma-separated, of {', '.join(OperatorTokenScope.values)} (default: all)",
        )
        parser.add_argument("--days", type=float, default=DEFAULT_LIFETIME.days, help="lifetime (at most 365)")
        parser.add_argument(
            "--service-account",
            action="store_true",
            help="create the operator account without a password when it does not exist",
        )

    def handle(self, *args, username: str, name: str, scopes: str, days: float, service_account: bool, **options):
        user = User.objects.filter(username=username).first()
        try:
            if user is None:
                if not service_account:
                    raise CommandError(f"no user {username!r} (add --service-account to create one)")
                user = user_create(username=username, role=Role.OPERATOR, tenant=None, password=None)
                self.stdout.write(f"created service account {username} (operator, no password)")
            token, raw = operator_token_create(
                user=user,
                name=name or "cli",
                scopes=[s.strip() for s in scopes.split(",") if s.strip()],
                expires_at=timezone.now() + timedelta(days=days),
            )
        except ValidationError as exc:
            messages = exc.message_dict.values() if hasattr(exc, "error_dict") else [exc.messages]
            raise CommandError("; ".join(m for group in messages for m in group)) from exc
        self.stdout.write(
            f"operator token {token.prefix}… for {username}, scopes {','.join(token.scopes)}, "
            f"expires {token.expires_at:%Y-%m-%d %H:%M} UTC"
        )
        self.stdout.write(f"token (shown once): {raw}")
