"""A local replica whose row does not commit does not outlive it (capacity/autoscaling/actuators/local.py): a
failed write after the process started, or a failure of the transaction the launch was registered in, stops the
process and gives its GPUs back. Without it the process would serve nobody and hold its GPUs until a person found it.
"""

import pytest
from django.db import DatabaseError, connections, transaction

from capacity.autoscaling import services
from capacity.autoscaling.actuators.local import LocalActuator, pid_alive
from endpoints.models import Replica
from tests.factories import EndpointFactory
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def launched_pids(monkeypatch):
    """The pid of every replica process the local actuator starts in the test, whatever happens to its row."""
    pids = []
    popen = LocalActuator._start.__globals__["subprocess"].Popen

    def recording(*args, **kwargs):
        proc = popen(*args, **kwargs)
        pids.append(proc.pid)
        return proc

    monkeypatch.setattr(LocalActuator._start.__globals__["subprocess"], "Popen", recording)
    return pids


@pytest.fixture
def tp2(db, host_gpus, child_envs, reap_local_replicas, clean_store):
    host_gpus("4/2")
    options = {"actuator": "local", "profile": "tiny", "tensor_parallel_size": 2}
    return EndpointFactory(name="paired", launch_options=options, desired_replicas=1, min_replicas=1)


def gone(pids):
    return wait_for(lambda: not any(pid_alive(pid) for pid in pids), timeout=10, message="the processes stopped")


def holders() -> set[str]:
    """The names the GPU ledger's file holds GPUs for, dead processes' included (``held`` leaves those out)."""
    return set(LocalActuator.gpu_ledger()._read())


def test_a_write_failing_after_the_start_stops_the_process_and_frees_its_gpus(tp2, launched_pids, monkeypatch):
    def broken(self, replica, state, reason):
        raise DatabaseError("connection lost")

    monkeypatch.setattr(LocalActuator, "move", broken)
    with pytest.raises(DatabaseError):
        LocalActuator().launch(tp2, 1)
    assert len(launched_pids) == 1
    gone(launched_pids)
    assert holders() == set()


def test_a_launch_whose_commit_fails_stops_what_it_started(tp2, launched_pids, monkeypatch):
    seen = {}

    def failing_commit(wrapper):
        seen["holders"] = holders()
        seen["alive"] = [pid_alive(pid) for pid in launched_pids]
        raise DatabaseError("could not serialize access")

    with monkeypatch.context() as patch, pytest.raises(DatabaseError):
        patch.setattr(type(connections["default"]), "commit", failing_commit)
        services.launch_capped(endpoint=tp2, actuator=LocalActuator(), wanted=2)
    assert len(launched_pids) == 2 and seen["alive"] == [True, True]  # both were running when the commit failed
    assert len(seen["holders"]) == 2
    gone(launched_pids)
    assert not Replica.objects.filter(endpoint=tp2).exists()  # rolled back with the transaction
    assert holders() == set()  # released, not left to lapse


def test_a_block_that_commits_keeps_its_replicas_and_a_nested_one_defers_to_the_outer(tp2, launched_pids):
    actuator = LocalActuator()
    with actuator.launches_undone_on_error(), transaction.atomic():
        (kept,) = actuator.launch(tp2, 1)
    assert pid_alive(int(kept.actuator_ref))
    with pytest.raises(RuntimeError), actuator.launches_undone_on_error(), transaction.atomic():
        with actuator.launches_undone_on_error(), transaction.atomic():  # a savepoint of the outer transaction
            (inner,) = actuator.launch(tp2, 1)
        raise RuntimeError("the outer block fails after the inner one succeeded")
    gone([int(inner.actuator_ref)])
    assert not Replica.objects.filter(pk=inner.pk).exists()  # its row went with the outer transaction
    assert pid_alive(int(kept.actuator_ref))  # started before the failing block: not its to undo
    assert holders() == {kept.name}
