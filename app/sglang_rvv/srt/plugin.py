"""The SGLang plugin: registered through the ``sglang.srt.plugins`` entry point.

Hooks (SGLang's HookRegistry):

* AROUND ``ServerArgs.add_cli_args``: add the flags to SGLang's own parser.
* AROUND ``ServerArgs.from_cli_args``: resolve them. ``from_cli_args`` keeps
  only dataclass fields, so the settings ride on the ServerArgs object as an
  attribute, which survives the pickling into each scheduler process.
* AFTER ``ModelRunner.load_model``: in each scheduler process, after weights
  are loaded and post-processed, register the attention backend
  (:mod:`sglang_rvv.srt.attention`), install the policy, log its summary and
  the bytes each projection streams per token, write the report and set up
  metrics.
* AFTER ``ModelRunner.forward``: flush counters into Prometheus.
* AFTER ``<Model>.load_weights``: every weight update (from disk, tensors,
  distributed) copies into the existing storage, which no pointer check can
  see; free and rebuild the packed buffers after each one, and refresh the byte
  gauges of ``/metrics``.
* the SGLang workarounds of :mod:`sglang_rvv.srt.workarounds`, registered here too.
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
from . import flags, workarounds

log = logging.getLogger("sglang_rvv")
SETTINGS_ATTR = "_sglang_rvv_settings"
EXPORTER_ATTR = "_sglang_rvv_metrics"
# The hook target of the scheduler-side hooks; the benchmark marks memory on the same method.
RUNNER = "sglang.srt.model_executor.model_runner.ModelRunner"
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
    from ..adapters import register
    from ..policy import install_rvv_policy, policy_of
    from .adapter import SGLANG_ADAPTER
    from .attention import register as register_attention

    register(SGLANG_ADAPTER)
    register_attention()  # before the runner builds its attention backend, after the model
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


def register() -> None:
    server_args = "sglang.srt.server_args.ServerArgs"
    HookRegistry.register(f"{server_args}.add_cli_args", _add_cli_args, HookType.AROUND)
    HookRegistry.register(f"{server_args}.from_cli_args", _from_cli_args, HookType.AROUND)
    HookRegistry.register(f"{RUNNER}.load_model", _after_load_model, HookType.AFTER)
    HookRegistry.register(f"{RUNNER}.forward", _after_forward, HookType.AFTER)
    for model_class in sglang_classes():
        HookRegistry.register(f"{model_class}.load_weights", _after_load_weights, HookType.AFTER)
    workarounds.register()
    log.debug("sglang_rvv plugin registered (python %s)", sys.version.split()[0])
