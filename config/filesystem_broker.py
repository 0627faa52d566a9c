"""The embedded default's Celery broker: kombu's file-system transport with every file written whole, then renamed.

kombu's own transport creates a message file, then locks and writes it, while a consumer lists, moves and reads
it without taking the lock: it can read an empty or partial payload and the worker dies (``JSONDecodeError``);
the exchange tables race the same way when two processes declare queues at once. Here a message or a table is
written under a temporary name and renamed into place (one system call: a reader sees all of it or nothing, as
Maildir delivers mail), a consumer claims a message by renaming it into the processed folder (one consumer
wins), and a message that still cannot be decoded is set aside and logged instead of ending the worker. Why this
transport and not another: docs/architecture.md, "The embedded default".
"""

from __future__ import annotations

import fcntl
import logging
import os
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path
from queue import Empty
from time import monotonic_ns

from kombu.exceptions import ChannelError
from kombu.transport import filesystem, virtual
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

log = logging.getLogger(__name__)

# Temporary files start with a dot: a consumer's filter (``<queue>.msg`` after the first dot) never matches them.
_PARTIAL_PREFIX = ".part-"


def write_whole(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that no reader ever sees part of it (a temporary file renamed over it)."""
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=_PARTIAL_PREFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(partial, path)
    except BaseException:
        try:
            os.unlink(partial)
        except OSError:
            pass
        raise


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs):
        # The name sorts by time (one monotonic clock for the whole machine): kombu's milliseconds left messages
        # sent within one in random order; nanoseconds keep each publisher's order.
        name = f"{monotonic_ns():020d}_{uuid.uuid4()}.{queue}.msg"
        try:
            write_whole(Path(self.data_folder_out) / name, str_to_bytes(dumps(payload)))
        except OSError as exc:
            raise ChannelError(f"Cannot add message {name!r} to {self.data_folder_out}") from exc

    def _get(self, queue):
        wanted = f"{queue}.msg"
        for name in sorted(os.listdir(self.data_folder_in)):
            if name.partition(".")[2] != wanted:
                continue
            claimed = os.path.join(self.processed_folder, name)
            try:
                os.rename(os.path.join(self.data_folder_in, name), claimed)
            except FileNotFoundError:
                continue  # another consumer claimed it first
            except OSError as exc:
                raise ChannelError(
                    f"Cannot claim {name!r} (the processed folder must be on the same file system)"
                ) from exc
            try:
                with open(claimed, "rb") as f:
                    payload = f.read()
                if not self.store_processed:
                    os.remove(claimed)
            except OSError as exc:
                raise ChannelError(f"Cannot read {claimed!r}") from exc
            try:
                return loads(bytes_to_str(payload))
            except ValueError:
                # Left by an older writer that crashed mid-write: one lost message, not a dead worker.
                log.error("broker message %s is not JSON (%d bytes); dropped", name, len(payload))
        raise Empty()

    def get_table(self, exchange):
        file = self._exchange_file(exchange)
        try:
            table = file.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise ChannelError(f"Cannot open {file}") from exc
        return [filesystem.exchange_queue_t(*q) for q in loads(bytes_to_str(table))]

    def _queue_bind(self, exchange, routing_key, pattern, queue):
        binding = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        with self._tables_locked():
            queues = self.get_table(exchange)
            if binding not in queues:
                self._write_table(exchange, [binding, *queues])

    def _delete(self, queue, exchange, routing_key, pattern, *args, **kwargs):
        virtual.Channel._delete(self, queue, exchange, routing_key, pattern, *args, **kwargs)
        binding = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        with self._tables_locked():
            queues = self.get_table(exchange)
            if binding in queues:
                self._write_table(exchange, [q for q in queues if q != binding])

    def _write_table(self, exchange, queues) -> None:
        file = self._exchange_file(exchange)
        try:
            write_whole(file, str_to_bytes(dumps(queues)))
        except OSError as exc:
            raise ChannelError(f"Cannot write {file}") from exc

    @contextmanager
    def _tables_locked(self):
        # Readers need no lock (a table is replaced whole); writers take turns, so no binding is lost.
        self.control_folder.mkdir(parents=True, exist_ok=True)
        with open(self.control_folder / ".lock", "ab") as lock_file:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock_file.fileno(), fcntl.LOCK_UN)


class Transport(filesystem.Transport):
    Channel = Channel
    driver_name = "filesystem (whole files)"
