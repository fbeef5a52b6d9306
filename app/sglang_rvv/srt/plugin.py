"""The SGLang plugin: registered through the ``sglang.srt.plugins`` entry point.

Hooks (SGLang's HookRegistry):

* AROUND ``ServerArgs.add_cli_args``: add the flags to SGLang's own parser.
* AROUND ``ServerArgs.from_cli_args``: resolve them. ``from_cli_args`` keeps
  only dataclass fields, so the settings ride on the ServerArgs object as an
  attribute, which survives the pickling into each scheduler process.
* AFTER ``ModelRunner.load_model``: in each scheduler process, after weights
  are loaded and post-processed, install the policy, log its summary and the
  bytes each projection streams per token, write the report and set up metrics.
* AFTER ``ModelRunner.forward``: flush counters into Prometheus.
* AFTER ``<Model>.load_weights``: every weight update (from disk, tensors,
  distributed) copies into the existing storage, which no pointer check can
  see; free and rebuild the packed buffers after each one, and refresh the byte
  gauges of ``/metrics``.
* AROUND ``SchedulerWeightUpdaterManager.update_weights_from_disk`` and AFTER
  ``Scheduler.process_input_requests``: a disk weight update that reaches a busy
  scheduler waits until it is idle, or is refused with a clean error, instead of
  killing the server (see ``_around_update_weights_from_disk``). This holds with
  the flag off too: the crash is SGLang's, not the policy's.
* AROUND ``OpenAIServingCompletion/Chat._validate_request``: a request for a model this
  server does not serve gets a 400 naming the served model, as ``/v1/responses`` already
  does; SGLang would otherwise answer it with whatever model it has.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from ..archs import sglang_classes
from ..inductor_cache import STATE_ENV
from ..jsonfile import write_json
from . import flags

log = logging.getLogger("sglang_rvv")
SETTINGS_ATTR = "_sglang_rvv_settings"
EXPORTER_ATTR = "_sglang_rvv_metrics"
# The hook target of the scheduler-side hooks; the benchmark marks memory on the same method.
RUNNER = "sglang.srt.model_executor.model_runner.ModelRunner"
SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
WEIGHT_UPDATER = "sglang.srt.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager"
PENDING_UPDATE_ATTR = "_sglang_rvv_pending_weight_update"
# How long a disk weight update waits for a busy scheduler before it is refused. The tokenizer
# holds its write lock meanwhile, so no new request arrives and the scheduler normally drains
# within one or two iterations; only requests it cannot finish on its own keep it busy longer.
UPDATE_WAIT_SECONDS = 30.0
OPENAI_SERVING = ("sglang.srt.entrypoints.openai.serving_completions.OpenAIServingCompletion",
                  "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat")
# What a client that names no model sends (SGLang's protocol default).
ANY_MODEL = "default"
_parsers: list[argparse.ArgumentParser] = []  # the parser our flags went into, for errors


def _add_cli_args(original, parser, *args, **kwargs):
    result = original(parser, *args, **kwargs)
    flags.add_arguments(parser)
    _parsers.append(parser)
    return result


def _from_cli_args(original, cls, args, *rest, **kwargs):
    server_args = original(cls, args, *rest, **kwargs)
    try:
        settings = flags.resolve(args)
    except ValueError as error:
        parser = _parsers[-1] if _parsers else argparse.ArgumentParser(prog="sglang serve")
        parser.error(str(error))  # exits 2 with the usage line, like any argparse error
    setattr(server_args, SETTINGS_ATTR, settings)
    return server_args


def settings_of(server_args) -> flags.RvvSettings | None:
    return getattr(server_args, SETTINGS_ATTR, None)


def _report_path(settings: flags.RvvSettings, tp_rank: int) -> Path:
    if settings.report_path:
        path = Path(settings.report_path)
    else:
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        path = Path(cache_dir()) / flags.REPORT_NAME
    return path if tp_rank == 0 else path.with_name(f"{path.stem}.rank{tp_rank}{path.suffix}")


def _write_report(runner, settings: flags.RvvSettings, report, **extra) -> None:
    tp_rank = getattr(runner, "tp_rank", 0)
    path = _report_path(settings, tp_rank)
    log.info("sglang_rvv: report at %s", path)
    payload = dict(asdict(report), settings=asdict(settings), tp_rank=tp_rank, **extra)
    try:
        write_json(path, payload)
    except OSError as error:
        log.warning("sglang_rvv: could not write the report to %s (%s); pass --cpu-rvv-report-path", path, error)


def _after_load_model(result, runner, *args, **kwargs):
    settings = settings_of(runner.server_args)
    if settings is None or not settings.active:
        return result
    from ..policy import install_rvv_policy, policy_of

    model = runner.model
    started = time.monotonic()
    try:
        report = install_rvv_policy(model, settings.config)
    except Exception as error:  # serving never fails because of the policy
        log.warning("sglang_rvv: policy not installed, serving row-major: %s: %s", type(error).__name__, error)
        return result
    # Packing is part of every flag-on start, warm cache or not: the start benchmark reports it.
    install_seconds = time.monotonic() - started
    policy = policy_of(model)
    if report.adapter is not None:  # an unknown architecture was already warned about
        from .metrics import bytes_line

        log.info("%s; installed in %.1f s", report.summary(), install_seconds)
        log.info(bytes_line(policy, model))
    extra = {"install_seconds": install_seconds}
    cache_state = os.environ.get(STATE_ENV)
    if cache_state:
        extra["cache_state"] = cache_state
    if settings.warmup and policy is not None:
        from ..warmup import warm_up

        try:
            warmup = warm_up(policy)
        except Exception as error:  # a request would hit the same error; report it, compile lazily
            log.warning("sglang_rvv: warm-up failed, compiling on demand: %s: %s", type(error).__name__, error)
        else:
            log.info(warmup.summary())
            extra["warmup"] = asdict(warmup)
    _write_report(runner, settings, report, **extra)
    if policy is not None and getattr(runner.server_args, "enable_metrics", False):
        from ..ops import PROVIDER_NAME
        from .metrics import MetricsExporter

        exporter = MetricsExporter(policy, model, provider=PROVIDER_NAME, cache_state=cache_state or "none")
        setattr(runner, EXPORTER_ATTR, exporter)
    return result


def _after_forward(result, runner, *args, **kwargs):
    exporter = getattr(runner, EXPORTER_ATTR, None)
    if exporter is not None:
        exporter.flush()
    return result


def _after_load_weights(result, model, *args, **kwargs):
    from ..policy import invalidate_rvv_packed_weights, policy_of
    from .metrics import MetricsExporter, bytes_line

    report = invalidate_rvv_packed_weights(model)
    if report is not None:
        policy = policy_of(model)
        log.info("sglang_rvv: weights updated; packed buffers rebuilt (%s)", report.summary())
        log.info(bytes_line(policy, model))
        exporter = MetricsExporter.of(policy)
        if exporter is not None:  # /metrics shows the new buffers before the next forward
            exporter.refresh()
    return result


def _scheduler_busy(scheduler) -> str | None:
    """What keeps SGLang's post-update cache flush from running now, or None when it can run.

    The same condition as ``Scheduler.flush_cache``, which fails (and the update then asserts)
    whenever it is false.
    """
    if scheduler.is_fully_idle(ignore_waiting=scheduler._engine_paused):
        return None
    return (f"#running-req: {len(scheduler.running_batch.reqs)}, #queue-req: {len(scheduler.waiting_queue)}"
            f"{', engine paused' if scheduler._engine_paused else ''}")


def _refuse_update(reason: str):
    from sglang.srt.managers.io_struct import UpdateWeightFromDiskReqOutput

    message = f"Weights not updated: {reason}. The server keeps serving the current weights."
    log.warning("sglang_rvv: %s", message)
    return UpdateWeightFromDiskReqOutput(success=False, message=message)


def _around_update_weights_from_disk(original, updater, recv_req, *args, **kwargs):
    """Run a disk weight update only when the cache flush that ends it can run.

    SGLang loads the new weights, then flushes the KV cache and asserts that the flush worked;
    the assertion kills the scheduler and with it the server. The flush fails while any request
    is still held, and one is held even when every client has its answer: the overlap scheduler
    streams a request's last token while the next step for it is already launched, and frees it
    one iteration later. An update that arrives in between (the tokenizer sends it as soon as the
    last stream ends) is deferred here, before any weight is touched, and run once the scheduler
    is idle (``_after_process_input_requests``), or refused with a clean error when it cannot
    become idle (``_pending_update_reply``).
    """
    scheduler = updater.scheduler
    busy = None if not recv_req.flush_cache or scheduler is None else _scheduler_busy(scheduler)
    if busy is None:
        return original(updater, recv_req, *args, **kwargs)
    if getattr(scheduler, PENDING_UPDATE_ATTR, None) is not None:
        return _refuse_update("another weight update is already waiting for the scheduler to go idle")
    deadline = time.monotonic() + UPDATE_WAIT_SECONDS
    reply = _pending_update_reply(scheduler, recv_req, deadline)
    if reply is None:  # no reply yet: _after_process_input_requests sends it
        log.info("sglang_rvv: weight update deferred until the scheduler is idle (%s)", busy)
        setattr(scheduler, PENDING_UPDATE_ATTR, (recv_req, deadline))
    return reply


def _pending_update_reply(scheduler, recv_req, deadline: float):
    """The reply to the deferred update now, or None while it should keep waiting."""
    busy = _scheduler_busy(scheduler)
    if busy is None:
        log.info("sglang_rvv: the scheduler is idle; running the deferred weight update")
        return scheduler.weight_updater.update_weights_from_disk(recv_req)
    if scheduler._engine_paused:
        # Paused in place, the held requests only move after /continue_generation, which a
        # client sends once this update has answered: waiting cannot end well.
        return _refuse_update(f"the engine is paused with requests in flight ({busy}); continue or "
                              "abort them first, or pause with mode 'retract'")
    if time.monotonic() >= deadline:
        return _refuse_update(f"the scheduler is still busy after {UPDATE_WAIT_SECONDS:.0f} s ({busy})")
    return None


def _after_process_input_requests(result, scheduler, *args, **kwargs):
    """Once per scheduler iteration: answer a deferred weight update when it can be answered."""
    pending = getattr(scheduler, PENDING_UPDATE_ATTR, None)
    if pending is None:
        return result
    reply = _pending_update_reply(scheduler, *pending)
    if reply is None:
        return result
    setattr(scheduler, PENDING_UPDATE_ATTR, None)
    recv_req = pending[0]
    # Where process_input_requests sends the reply of a request it dispatched.
    if scheduler.rust_server is not None:
        scheduler.rust_server.push_control_output(recv_req, reply)
    else:
        scheduler.ipc_channels.send_to_tokenizer.send_output(reply, recv_req)
    return result


def unknown_model(requested: str, served: str, aliases: tuple[str, ...] = ()) -> str | None:
    """The error for a request naming a model this server does not serve, else None. The
    served name, its aliases and SGLang's "default" name it; "NAME:adapter" is a LoRA
    adapter of NAME."""
    known = (served, *aliases, ANY_MODEL)
    if requested in known or requested.split(":", 1)[0].strip() in known:  # a served name may hold ':'
        return None
    return f"The model '{requested}' does not exist: this server serves '{served}' (GET /v1/models)"


def _around_validate_request(original, serving, request, *args, **kwargs):
    error = original(serving, request, *args, **kwargs)
    if error or not getattr(request, "model", None):
        return error
    manager, started = serving.tokenizer_manager, serving.tokenizer_manager.server_args
    # A disk weight update renames the served model to the new path (SGLang's
    # _update_model_path_info); the names it started with still name this server.
    return unknown_model(request.model, started.served_model_name,
                         (manager.served_model_name, manager.model_path, started.model_path))


def register() -> None:
    server_args = "sglang.srt.server_args.ServerArgs"
    HookRegistry.register(f"{server_args}.add_cli_args", _add_cli_args, HookType.AROUND)
    HookRegistry.register(f"{server_args}.from_cli_args", _from_cli_args, HookType.AROUND)
    HookRegistry.register(f"{RUNNER}.load_model", _after_load_model, HookType.AFTER)
    HookRegistry.register(f"{RUNNER}.forward", _after_forward, HookType.AFTER)
    for model_class in sglang_classes():
        HookRegistry.register(f"{model_class}.load_weights", _after_load_weights, HookType.AFTER)
    HookRegistry.register(f"{WEIGHT_UPDATER}.update_weights_from_disk", _around_update_weights_from_disk,
                          HookType.AROUND)
    HookRegistry.register(f"{SCHEDULER}.process_input_requests", _after_process_input_requests, HookType.AFTER)
    for serving in OPENAI_SERVING:
        HookRegistry.register(f"{serving}._validate_request", _around_validate_request, HookType.AROUND)
    log.debug("sglang_rvv plugin registered (python %s)", sys.version.split()[0])
