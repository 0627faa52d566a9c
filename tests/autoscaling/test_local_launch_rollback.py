"""A local replica whose row does not commit does not outlive it (capacity/autoscaling/actuators/local.py): a
failed write after the process started, or a failure of the transaction the launch was registered in, stops the
process and gives its GPUs back. Without it the process would serve nobody and hold its GPUs until a person found it.
"""

import pytest
from django.db import DatabaseError, transaction

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


def test_a_write_failing_after_the_start_stops_the_process_and_frees_its_gpus(tp2, launched_pids, monkeypatch):
    def broken(self, replica, state, reason):
        raise DatabaseError("connection lost")

    monkeypatch.setattr(LocalActuator, "move", broken)
    with pytest.raises(DatabaseError):
        LocalActuator().launch(tp2, 1)
    assert len(launched_pids) == 1
    gone(launched_pids)
    assert LocalActuator.gpu_ledger().held() == {}


def test_a_launch_whose_transaction_fails_after_it_stops_what_it_started(tp2, launched_pids, monkeypatch):
    real_launch = LocalActuator.launch

    def launch_then_fail(self, endpoint, count, *, standby=False):
        started = real_launch(self, endpoint, count, standby=standby)
        assert all(pid_alive(int(r.actuator_ref)) for r in started)
        assert sum(len(g) for g in LocalActuator.gpu_ledger().held().values()) == 2 * count
        raise DatabaseError("could not serialize access")  # e.g. the commit of the launch's transaction

    monkeypatch.setattr(LocalActuator, "launch", launch_then_fail)
    with pytest.raises(DatabaseError):
        services.launch_capped(endpoint=tp2, actuator=LocalActuator(), wanted=2)
    assert len(launched_pids) == 2
    gone(launched_pids)
    assert not Replica.objects.filter(endpoint=tp2).exists()  # rolled back with the transaction
    assert LocalActuator.gpu_ledger().held() == {}


def test_a_block_that_commits_keeps_its_replicas_and_a_nested_one_defers_to_the_outer(tp2, launched_pids):
    actuator = LocalActuator()
    with actuator.launches_undone_on_error(), transaction.atomic():
        (kept,) = actuator.launch(tp2, 1)
    assert pid_alive(int(kept.actuator_ref))
    with pytest.raises(RuntimeError), actuator.launches_undone_on_error():
        with actuator.launches_undone_on_error(), transaction.atomic():
            (inner,) = actuator.launch(tp2, 1)
        raise RuntimeError("the outer block fails after the inner one committed")
    gone([int(inner.actuator_ref)])
    assert pid_alive(int(kept.actuator_ref))  # started before the failing block: not its to undo
    assert set(LocalActuator.gpu_ledger().held()) == {kept.name}
