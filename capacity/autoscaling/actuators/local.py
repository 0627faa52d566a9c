"""The local actuator: replicas as processes on this host, on free ports (simulated vLLM, or real vLLM).

Launch options come from ``Endpoint.launch_options``: for ``sim`` endpoints ``profile``, ``speed``,
``profile_opts`` (dict), ``faults`` (dict); for ``vllm`` endpoints any ``serve_command`` option, and the
operator-only ``cpu_kvcache_gib`` and ``offline`` (``launch_env.vllm_engine_env``); for both ``cpus`` (the
replica's CPU allotment: thread pools are sized from it, see ``launch_env``).

A ``vllm`` replica serves the endpoint's model profile (a directory of that name under
``INFERCAP["VLLM_MODELS_DIR"]`` when there is one) under the endpoint's name, from the engine interpreter
(``INFERCAP["VLLM_PYTHON"]``, else .venv-engine's) in module form, else the ``vllm`` console script; it runs
outside the repository root and without the platform's environment, and is ready when ``GET /health`` answers 200
(it binds its port long before the model is loaded). The ready transition records the cold start.

On a host with GPUs (``INFERCAP["LOCAL_GPUS"]``) a replica gets its whole tensor-parallel group inside one NVLink
domain, all or none, as its ``CUDA_VISIBLE_DEVICES`` (``local_gpus.py``, docs/placement.md); a launch that finds no
whole group free starts nothing more and fails with "capped at <n> of <count>: <why>". Without GPUs nothing is
allotted. A MIG profile's replica gets one of this host's slices of that profile (``INFERCAP["LOCAL_MIG"]``), named
by its UUID; on a host that lists slices, a launch finds none of its profile, or a whole-GPU launch finds only slices,
is an error, not a replica that sees every device.

A replica's pid is its ``actuator_ref``. Processes are started in their own session so a worker's shutdown
signal does not take them down; the worker that started one reaps it, any other finds it by pid. A process whose
row does not commit is stopped and its GPUs released: a failed write after the start does it at once, and a caller
that registers launches in a transaction of its own encloses it in ``launches_undone_on_error``.
"""

import contextlib
import inspect
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import connection
from django.utils import timezone

from capacity.autoscaling.actuators.base import (
    Actuator,
    ActuatorError,
    kv_transfer_flag,
    launch_role,
    launch_version_id,
)
from capacity.autoscaling.actuators.local_gpus import HOST, GpuLedger, NoWholeGroup, inventory, mig_inventory
from capacity.autoscaling.actuators.replica_shape import engine_gpus, launch_hardware
from capacity.hardware.profiles import DEFAULT_PROFILE, ROOFLINES
from capacity.models import HardwareProfile
from capacity.runtimes import vllm
from capacity.runtimes.launch_env import launch_env
from capacity.runtimes.launch_options import argv_value
from capacity.runtimes.ports import free_port
from endpoints.models import Endpoint, Replica, ReplicaState, Runtime
from placement.cluster import Node

log = logging.getLogger(__name__)

BASE_DIR = Path(__file__).resolve().parents[3]
# What `make engine` installs: vLLM for CPUs (scripts/install_engine.sh); the default engine interpreter.
ENGINE_PYTHON = BASE_DIR / ".venv-engine" / "bin" / "python"
# Popen objects of the processes this Python process started, so exits are reaped (no zombies counted alive).
_CHILDREN: dict[int, subprocess.Popen] = {}
# This thread's open ``launches_undone_on_error`` block: (replica name, pid, GPU ledger) of each process it started.
_UNDO = threading.local()


def pid_alive(pid: int) -> bool:
    child = _CHILDREN.get(pid)
    if child is not None:
        return child.poll() is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie answers kill(0) but is gone
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def runs(pid: int, port: int) -> bool:
    """Whether ``pid`` still runs the replica serving ``port`` (pids get reused: a stranger is not it)."""
    child = _CHILDREN.get(pid)
    if child is not None:
        return child.poll() is None
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return pid_alive(pid)  # no /proc (not Linux): trust the pid
    return str(port).encode() in argv and pid_alive(pid)


def _undo(name: str, pid: int, ledger: GpuLedger | None) -> None:
    """Stop a replica's process and give its GPUs back, as far as each step goes (the caller is already failing)."""
    try:
        stop_pid(pid)
    except Exception:
        log.exception("local actuator: could not stop %s (pid %s)", name, pid)
    if ledger is not None:
        try:
            ledger.release(name)
        except Exception:
            log.exception("local actuator: could not release the GPUs of %s", name)


def _leads_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except (ProcessLookupError, PermissionError):
        return False


def _signal(pid: int, sig: int, *, group: bool) -> None:
    # A replica leads its own session (start_new_session): its group holds what it started, such as vLLM's
    # engine-core process, which would outlive a signal to the API server alone.
    try:
        os.killpg(pid, sig) if group else os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_pid(pid: int, *, grace_s: float = 5.0) -> None:
    """SIGTERM to the replica's process group, then SIGKILL after the grace period; returns once it is gone."""
    if not pid_alive(pid):
        _CHILDREN.pop(pid, None)
        return
    group = _leads_group(pid)
    _signal(pid, signal.SIGTERM, group=group)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            break
        time.sleep(0.05)
    else:
        _signal(pid, signal.SIGKILL, group=group)
    if group:
        _signal(pid, signal.SIGKILL, group=True)  # whatever of the group outlived its leader
    child = _CHILDREN.pop(pid, None)
    if child is not None:
        try:
            child.wait(5)
        except subprocess.TimeoutExpired:
            log.warning("local actuator: pid %s did not exit after SIGKILL", pid)


def replica_argv(
    endpoint: Endpoint, *, port: int, host: str = "127.0.0.1", kv_events_port: int | None = None
) -> list[str]:
    """The replica's command line: every launch option value is checked (``argv_value``: no flag, whitespace or
    control character) and passed as its own argv element; no shell ever reads it. The served model is the
    endpoint's model profile, whatever the launch options say. A prefill or decode replica (``launch_role``) gets
    the endpoint's KV connector (``--kv-transfer-config``, docs/disaggregation.md), the simulated one too."""
    options = dict(endpoint.launch_options or {})
    kv_transfer = kv_transfer_flag(endpoint)
    if endpoint.runtime == Runtime.VLLM:
        allowed = set(inspect.signature(vllm.serve_command).parameters) - {"model", "port", "host", "executable"}
        allowed -= {"served_model_name", "extra_args", "python", "kv_events_port", "kv_transfer_config"}
        extra = {k: v for k, v in options.items() if k in allowed and v is not None}
        for key, value in extra.items():
            if not isinstance(value, bool):
                argv_value(key, value)
        flags = [str(a) for a in options.get("extra_args") or []]  # operator-only raw flags (endpoint API)
        if any("\x00" in a or not a for a in flags):
            raise ValueError("extra_args must be non-empty strings")
        # Operator-only, like every option outside the tenant allowlist: an interpreter or console script.
        chosen = {k: argv_value(k, options[k]) for k in ("executable", "python") if options.get(k)}
        launch = vllm.launcher(
            python=chosen.get("python") or vllm.engine_python(_setting("VLLM_PYTHON"), default=ENGINE_PYTHON),
            executable=chosen.get("executable"),
        )
        models_dir = _setting("VLLM_MODELS_DIR")
        argv = vllm.serve_command(
            model=argv_value(
                "model",
                vllm.model_argument(endpoint.model_profile.name, models_dir=Path(models_dir) if models_dir else None),
            ),
            port=port,
            host=host,
            served_model_name=argv_value("served model name", endpoint.name),
            extra_args=flags,
            kv_events_port=kv_events_port,
            kv_transfer_config=kv_transfer,
            **launch,
            **extra,
        )
        return argv
    argv = [sys.executable, "-m", "simulator.cli", "--runtime", "sim", "--host", host]
    argv += ["--port", str(port), "--served-model-name", argv_value("served model name", endpoint.name)]
    if options.get("profile"):
        argv += ["--profile", argv_value("profile", options["profile"])]
    argv += ["--speed", argv_value("speed", float(options.get("speed", 1.0)))]
    if options.get("runner"):
        argv += ["--runner", argv_value("runner", options["runner"])]
    slots, rank = endpoint.lora  # the simulator serves adapters as vLLM does with --enable-lora (docs/lora.md)
    if slots:
        argv += ["--max-loras", str(slots), "--max-lora-rank", str(rank)]
        if options.get("lora_load_s") is not None:
            argv += ["--lora-load-s", argv_value("lora_load_s", float(options["lora_load_s"]))]
    for flag, key in (("--profile-opt", "profile_opts"), ("--fault", "faults")):
        for name, value in (options.get(key) or {}).items():
            value = str(value).lower() if isinstance(value, bool) else value
            argv += [flag, argv_value(f"{key}.{name}", f"{name}={argv_value(f'{key}.{name}', value)}")]
    if kv_transfer:
        argv += ["--kv-transfer-config", kv_transfer]
        if (gbps := _kv_link_gbps(endpoint)) and (options.get("profile") or DEFAULT_PROFILE) in ROOFLINES:
            argv += ["--kv-link-gbps", argv_value("kv_link_gbps", float(gbps))]  # the transfer's time, simulated
    return argv


def _kv_link_gbps(endpoint: Endpoint) -> float | None:
    """The launch hardware's KV link (``HardwareProfile.kv_link_gbps``), for a simulated prefill or decode replica:
    the simulator moves its KV at that rate (simulator/kv_transfer.py), a token's bytes from its profile's model."""
    hardware_id = getattr(endpoint, "launch_hardware_profile_id", None) or endpoint.hardware_profile_id
    return HardwareProfile.objects.filter(pk=hardware_id).values_list("kv_link_gbps", flat=True).first()


def replica_env(endpoint: Endpoint) -> dict[str, str]:
    """Thread-pool sizes from the replica's CPU allotment (``cpus`` launch option), not this host's core count;
    for vLLM also its own variables (``vllm.serve_env``)."""
    options = endpoint.launch_options or {}
    if endpoint.runtime == Runtime.VLLM:
        return vllm.serve_env(options) | vllm.kv_transfer_env(kv_transfer_flag(endpoint))
    return launch_env(options, runtime=endpoint.runtime)


def _setting(name: str):
    return settings.INFERCAP.get(name) or None


def group_key(endpoint: Endpoint, size: int) -> str:
    """A waiting group's key: the endpoint, the pool it launches in (role, hardware, version) and the group's
    size; its capped launches and its reservation share it (``local_gpus.GpuLedger.allot``)."""
    hardware = getattr(endpoint, "launch_hardware_profile_id", None) or "-"
    return f"{endpoint.pk}/{launch_role(endpoint)}/{hardware}/{launch_version_id(endpoint) or '-'}/{size}"


def cold_start_s(replica: Replica, *, now=None) -> float:
    """Seconds from the replica's launch (its row) to now: its cold start when it has just turned ready."""
    return ((now or timezone.now()) - replica.created_at).total_seconds()


class LocalActuator(Actuator):
    name = "local"
    start_timeout_s = 600.0  # vLLM loading a large model takes minutes; past this a start counts as failed
    # A defragmenting move's lifetime: its copy's start and its source's drain (services.DRAIN_TIMEOUT_S), and a
    # minute; the reservation it opens room for lasts as long (defrag_ticks.RESERVE_S).
    defrag_move_s = start_timeout_s + 120.0 + 60.0

    def launch(self, endpoint: Endpoint, count: int, *, standby: bool = False) -> list[Replica]:
        started = []
        hardware = launch_hardware(endpoint)
        ledger = self.gpu_ledger(hardware)
        if ledger is None and mig_inventory():
            raise ActuatorError("this host lists only MIG slices (INFERCAP_LOCAL_MIG): no whole GPU for this profile")
        size = engine_gpus(endpoint, hardware) if ledger else 0
        # A slice's group never waits for the defragmenting step: every slice is a domain of its own.
        group = group_key(endpoint, size) if ledger is not None and ledger.devices is None else None
        for _ in range(count):
            try:
                replica = self._launch_one(
                    endpoint,
                    ledger,
                    standby=standby,
                    allot=lambda name, port: ledger.allot(name, size, port=port, group=group),
                )
            except NoWholeGroup as exc:
                # All or nothing: no part of a group is held, nothing more starts (docs/placement.md).
                raise ActuatorError(f"capped at {len(started)} of {count}: {exc}") from exc
            started.append(replica)
        return started

    def launch_at(self, endpoint: Endpoint, gpus: list[int]) -> Replica:
        """One replica on exactly ``gpus`` of this host (a defragmenting move's copy, docs/placement.md "Local");
        ``ActuatorError`` caused by ``NoWholeGroup`` where any of them is held or reserved."""
        ledger = self.gpu_ledger()
        if ledger is None:
            raise ActuatorError("this host names no GPUs (INFERCAP_LOCAL_GPUS)")
        try:
            return self._launch_one(
                endpoint, ledger, standby=False, allot=lambda name, port: ledger.allot_at(name, gpus, port=port)
            )
        except NoWholeGroup as exc:
            raise ActuatorError(f"copy not started: {exc}") from exc

    @contextlib.contextmanager
    def launches_undone_on_error(self):
        """Every replica process started inside the block is stopped, and its GPUs released, when the block raises:
        its row rolls back with the caller's transaction, and a process without a row serves nobody while holding
        its GPUs. Enter it outside the ``atomic`` block, so that a failed commit counts too."""
        outer = getattr(_UNDO, "started", None)
        _UNDO.started = started = []
        try:
            yield
        except BaseException:
            for name, pid, ledger in started:
                log.warning("local actuator: stopping %s (pid %s), whose launch did not commit", name, pid)
                _undo(name, pid, ledger)
            raise
        else:
            if outer is not None:  # an enclosing block still owns them
                outer.extend(started)
        finally:
            _UNDO.started = outer

    def _launch_one(self, endpoint: Endpoint, ledger: GpuLedger | None, *, standby: bool, allot) -> Replica:
        """Allot the replica's GPUs (``allot(name, port)``: its ``CUDA_VISIBLE_DEVICES``) and start it; its GPUs are
        released when the start fails."""
        log_dir = Path(settings.INFERCAP.get("SPOOL_DIR", BASE_DIR / "var")).parent / "replicas"
        log_dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        name = f"local-{uuid.uuid4().hex[:8]}"
        devices = allot(name, port) if ledger is not None else None
        try:
            replica = self._start(endpoint, name, port=port, standby=standby, log_dir=log_dir, devices=devices)
        except BaseException:
            if ledger is not None:
                ledger.release(name)
            raise
        pid = int(replica.actuator_ref)
        started = getattr(_UNDO, "started", None)
        if started is not None:
            started.append((name, pid, ledger))
        if ledger is not None:
            try:
                ledger.started(name, pid)
            except BaseException:  # its holding would lapse while the process runs on its GPUs
                _undo(name, pid, ledger)
                raise
        return replica

    def defrag_copies(self) -> dict[str, int]:
        """Replicas started as a defragmenting move's copy and still loading (name → endpoint id): not capacity
        until their source drains (the autoscaler leaves them out of its counts); a move older than its
        reservation's lifetime no longer counts. None on a host without GPUs or with a bad ``INFERCAP_LOCAL_GPUS``
        (the launches' error to report, not every tick's)."""
        try:
            ledger = self.gpu_ledger()
        except ActuatorError:
            return {}
        return ledger.moving(max_age_s=self.defrag_move_s) if ledger is not None else {}

    @staticmethod
    def gpu_ledger(hardware: HardwareProfile | None = None) -> GpuLedger | None:
        """This host's GPUs and their holders (``INFERCAP["LOCAL_GPUS"]``); None on a host without GPUs. For a MIG
        profile, this host's slices of that profile (``INFERCAP["LOCAL_MIG"]``), each a domain of one: an
        ActuatorError where the host lists GPUs or slices but none of that profile."""
        nodes = inventory(settings.INFERCAP.get("LOCAL_GPUS"))
        if hardware is None or not hardware.mig_profile:
            return GpuLedger(nodes, Path(settings.VAR_DIR), alive=runs) if nodes else None
        slices = mig_inventory()
        if not slices and not nodes:
            return None  # a host without GPUs: replicas run as they always did
        devices = slices.get(hardware.mig_profile)
        if not devices:
            raise ActuatorError(f"this host has no MIG {hardware.mig_profile} slice (INFERCAP_LOCAL_MIG)")
        return LocalActuator.mig_ledger(hardware.mig_profile, devices)

    @staticmethod
    def mig_ledger(profile: str, devices: list[str]) -> GpuLedger:
        """The holders of this host's MIG slices of ``profile`` (``devices``: their UUIDs)."""
        nodes = [Node(HOST, len(devices), island=1)]
        return GpuLedger(nodes, Path(settings.VAR_DIR), alive=runs, name=f"local-mig-{profile}", devices=devices)

    def _start(
        self, endpoint: Endpoint, name: str, *, port: int, standby: bool, log_dir: Path, devices: str | None
    ) -> Replica:
        """Register one replica and start its process; ``devices``: its GPUs' ``CUDA_VISIBLE_DEVICES``."""
        # vLLM publishes its KV-cache events on a port of its own; the proxy subscribes (the live precise index).
        events_port = free_port() if endpoint.runtime == Runtime.VLLM else None
        try:
            argv = replica_argv(endpoint, port=port, kv_events_port=events_port)
            launch_vars = replica_env(endpoint)
        except (TypeError, ValueError) as exc:
            raise ActuatorError(f"bad launch options for {endpoint.name}: {exc}") from exc
        if devices is not None:
            launch_vars["CUDA_VISIBLE_DEVICES"] = devices
        if endpoint.runtime == Runtime.VLLM and shutil.which(argv[0]) is None:
            raise ActuatorError(f"cannot start {argv[0]!r}: {vllm.ENGINE_MISSING}")
        replica = Replica.objects.create(
            endpoint=endpoint,
            name=name,
            url=f"http://127.0.0.1:{port}",
            served_model_name=endpoint.name,  # its --served-model-name (replica_argv): a later rename keeps it
            kv_events_endpoint=f"tcp://127.0.0.1:{events_port}"
            if events_port and "--kv-events-config" in argv
            else "",
            actuator=self.name,
            is_standby=standby,
            concurrency_limit=endpoint.concurrency_limit,
            version_id=launch_version_id(endpoint),
            hardware_profile_id=getattr(endpoint, "launch_hardware_profile_id", None),  # a spot pool's
            role=launch_role(endpoint),  # a disaggregated endpoint's prefill or decode pool
        )
        if endpoint.runtime == Runtime.VLLM:
            # Third-party code: none of the platform's settings or credentials, and not the repository root as
            # its working directory (``python -m`` puts that first on the import path, where this repository's
            # top-level packages, ``platform`` among them, would shadow the standard library's).
            env, cwd = {**vllm.engine_base_env(), **launch_vars}, log_dir
        else:
            env, cwd = {**os.environ, **self._child_env(), **launch_vars}, BASE_DIR
        # Named by id: the endpoint name is the tenant's choice (two names could map to one file).
        with open(log_dir / f"endpoint-{endpoint.pk}-{name}.log", "ab") as out:
            try:
                proc = subprocess.Popen(
                    argv,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    cwd=str(cwd),
                    env=env,
                    start_new_session=True,
                )
            except OSError as exc:
                self.move(replica, ReplicaState.FAILED, f"could not start: {exc}")
                self.move(replica, ReplicaState.STOPPED, "start failed")
                raise ActuatorError(f"could not start {argv[0]}: {exc}") from exc
        _CHILDREN[proc.pid] = proc
        try:
            replica.actuator_ref = str(proc.pid)
            replica.save(update_fields=["actuator_ref"])
            gpus = f", GPUs {devices}" if devices is not None else ""
            self.move(replica, ReplicaState.STARTING, f"pid {proc.pid} on port {port}{gpus}")
        except BaseException:  # the row goes with the transaction: the process must not stay behind
            stop_pid(proc.pid)
            raise
        return replica

    @staticmethod
    def _child_env() -> dict:
        # A replica process that imports Django must reach the same database as the worker that started it.
        db = connection.settings_dict
        if db.get("ENGINE", "").endswith("postgresql") and db.get("NAME"):
            user, host, port = db.get("USER") or "", db.get("HOST") or "127.0.0.1", db.get("PORT") or "5432"
            return {"DATABASE_URL": f"postgres://{user}@{host}:{port}/{db['NAME']}"}
        return {}

    def terminate(self, replicas: list[Replica], *, reason: str) -> None:
        for replica in replicas:
            pid = self._own_pid(replica)
            if pid is not None:
                stop_pid(pid)
            self.stop_row(replica, reason)

    @staticmethod
    def _own_pid(replica: Replica) -> int | None:
        """The replica's pid, if that pid still runs this replica (pids get reused: never signal a stranger)."""
        if not replica.actuator_ref.isdigit():
            return None
        pid = int(replica.actuator_ref)
        if pid in _CHILDREN:
            return pid
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return pid if pid_alive(pid) else None  # no /proc (not Linux): trust the pid
        port = replica.url.rsplit(":", 1)[-1].encode()
        return pid if port in argv else None

    def sync(self, endpoint: Endpoint) -> None:
        now = timezone.now()
        # A stopped row whose process still runs (a crash between the kill and the row update, a test that only
        # closed rows) is stopped here, so replica processes do not outlive their rows.
        recent = endpoint.replicas.filter(
            actuator=self.name, state=ReplicaState.STOPPED, state_changed_at__gte=now - timedelta(hours=1)
        )
        for replica in recent:
            pid = self._own_pid(replica)
            if pid is not None and pid_alive(pid):
                stop_pid(pid)
        live = endpoint.replicas.filter(actuator=self.name).exclude(state=ReplicaState.STOPPED)
        for replica in live:
            pid = int(replica.actuator_ref) if replica.actuator_ref.isdigit() else None
            alive = pid is not None and pid_alive(pid)
            if replica.state == ReplicaState.FAILED:
                # Failed (by us or by the health checker): make sure the process is gone, then close the row.
                self.terminate([replica], reason="failed replica cleaned up")
            elif not alive:
                code = _CHILDREN.pop(pid).returncode if pid in _CHILDREN else None
                if self.move(replica, ReplicaState.FAILED, f"process {pid} exited (code {code})"):
                    self.move(replica, ReplicaState.STOPPED, "process gone")
            elif replica.state in (ReplicaState.PENDING, ReplicaState.STARTING):
                if self.healthy(replica.url):
                    if replica.state == ReplicaState.PENDING:
                        self.move(replica, ReplicaState.STARTING, "process up")
                    # Ready once GET /health answers 200 (vLLM binds its port long before its model is loaded).
                    seconds = cold_start_s(replica)
                    self.move(replica, ReplicaState.READY, f"health check passed: cold start {seconds:.1f} s")
                elif (now - replica.created_at).total_seconds() > self.start_timeout_s:
                    self.move(replica, ReplicaState.FAILED, f"not healthy after {self.start_timeout_s:.0f} s")
                    self.terminate([replica], reason="start timed out")
