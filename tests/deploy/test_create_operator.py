"""The documented way to create the first operator (platform/README.md): ``manage.py create_operator``."""

import pytest
from django.core.management import CommandError, call_command

from tenants.models import AuditEntry, Role, User


@pytest.mark.django_db
def test_the_first_operator_gets_a_printed_password_and_an_audit_entry(capsys):
    call_command("create_operator", "--username", "alice", "--email", "alice@example.com")
    password = capsys.readouterr().out.split("password (shown once): ")[1].strip()
    alice = User.objects.get(username="alice")
    assert alice.role == Role.OPERATOR and alice.is_staff and alice.tenant is None and alice.check_password(password)
    assert AuditEntry.objects.filter(action="user.create").exists()


@pytest.mark.django_db
def test_the_password_from_the_environment_is_never_printed(capsys, monkeypatch):
    monkeypatch.setenv("INFERCAP_OPERATOR_PASSWORD", "a-long-operator-passphrase")
    call_command("create_operator", "--username", "bob")
    assert "passphrase" not in capsys.readouterr().out
    assert User.objects.get(username="bob").check_password("a-long-operator-passphrase")
    with pytest.raises(CommandError, match="already exists"):
        call_command("create_operator", "--username", "bob")
    call_command("create_operator", "--username", "bob", "--if-missing")
    monkeypatch.setenv("INFERCAP_OPERATOR_PASSWORD", "short")
    with pytest.raises(CommandError):
        call_command("create_operator", "--username", "carol")
