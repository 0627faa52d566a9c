"""The embedded broker (config/filesystem_broker.py): publishers and a consumer in separate processes, as the beat,
the web server and the worker of `make run` are; no message read half-written, none lost, none delivered twice."""

import multiprocessing
import time
from pathlib import Path
from queue import Empty

import kombu
import pytest

from config.filesystem_broker import Transport
from config.settings.backends import resolve_backends
from config.settings.celery import celery_settings

TRANSPORT = "config.filesystem_broker:Transport"
# Big enough that a write takes a while; kombu's own transport loses a few percent of these to the race.
PAD = "x" * 2000


def _connection(folder: Path) -> kombu.Connection:
    options = resolve_backends(database_url="", redis_url="", var_dir=folder).celery_broker_options
    return kombu.Connection("filesystem://localhost//", transport=TRANSPORT, transport_options=options)


def _publish(folder: Path, tag: int, count: int) -> None:
    with _connection(folder) as connection:
        channel = connection.default_channel
        for i in range(count):
            channel._put("celery", {"tag": tag, "i": i, "pad": PAD})


def _bind(folder: Path, tag: int, count: int) -> None:
    with _connection(folder) as connection:
        channel = connection.default_channel
        for i in range(count):
            channel._queue_bind("celery.pidbox", "", "", f"worker-{tag}-{i}")


@pytest.fixture
def fork():
    return multiprocessing.get_context("fork")


def test_the_embedded_backends_choose_this_transport(tmp_path):
    settings = celery_settings(resolve_backends(database_url="", redis_url="", var_dir=tmp_path))
    connection = kombu.Connection(
        settings["CELERY_BROKER_URL"],
        transport=settings["CELERY_BROKER_TRANSPORT"],
        transport_options=settings["CELERY_BROKER_TRANSPORT_OPTIONS"],
    )
    assert connection.transport_cls is Transport or connection.transport.__class__ is Transport
    redis = celery_settings(resolve_backends(database_url="", redis_url="redis://127.0.0.1:6379/0", var_dir=tmp_path))
    assert redis["CELERY_BROKER_TRANSPORT"] is None  # Redis keeps kombu's own


def test_a_consumer_racing_two_publishers_gets_every_message_once_and_whole(tmp_path, fork):
    count = 1000
    publishers = [fork.Process(target=_publish, args=(tmp_path, tag, count)) for tag in range(2)]
    seen: list[tuple[int, int]] = []
    with _connection(tmp_path) as connection:
        channel = connection.default_channel
        for publisher in publishers:
            publisher.start()
        deadline = time.monotonic() + 120
        while len(seen) < 2 * count and time.monotonic() < deadline:
            try:
                message = channel._get("celery")  # kombu's raised JSONDecodeError here (a payload not yet written)
            except Empty:
                time.sleep(0.0005)
                continue
            assert message["pad"] == PAD
            seen.append((message["tag"], message["i"]))
    for publisher in publishers:
        publisher.join(timeout=30)
        assert publisher.exitcode == 0
    assert len(seen) == len(set(seen)) == 2 * count
    # Each publisher's messages arrive in the order sent.
    for tag in range(2):
        assert [i for t, i in seen if t == tag] == list(range(count))
    assert not list((tmp_path / "broker" / "in").iterdir())


def test_concurrent_bindings_to_one_exchange_are_all_kept_and_always_readable(tmp_path, fork):
    count = 60
    binders = [fork.Process(target=_bind, args=(tmp_path, tag, count)) for tag in range(2)]
    with _connection(tmp_path) as connection:
        channel = connection.default_channel
        for binder in binders:
            binder.start()
        while any(binder.is_alive() for binder in binders):
            channel.get_table("celery.pidbox")  # kombu's could read a table created but not yet written
        for binder in binders:
            binder.join(timeout=30)
            assert binder.exitcode == 0
        queues = {binding.queue for binding in channel.get_table("celery.pidbox")}
    assert queues == {f"worker-{tag}-{i}" for tag in range(2) for i in range(count)}


def test_an_unreadable_message_is_dropped_not_raised(tmp_path, caplog):
    with _connection(tmp_path) as connection:
        channel = connection.default_channel
        (tmp_path / "broker" / "in" / "1_torn.celery.msg").write_bytes(b'{"half": ')
        channel._put("celery", {"whole": True})
        assert channel._get("celery") == {"whole": True}
        with pytest.raises(Empty):
            channel._get("celery")
    assert "1_torn.celery.msg" in caplog.text
