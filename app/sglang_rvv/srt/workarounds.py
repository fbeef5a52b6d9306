"""Workarounds for two SGLang bugs, hooked whether the policy is on or off: both are SGLang's.
Each names the upstream report and the version it was checked against (sglang 0.5.21, the one
requirements/lock.txt pins); drop it once an upgrade fixes the bug.

* **A disk weight update that reaches a busy scheduler kills the server**
  (sgl-project/sglang#14062, closed without a fix). AROUND
  ``SchedulerWeightUpdaterManager.update_weights_from_disk`` and AFTER
  ``Scheduler.process_input_requests``: such an update waits until the scheduler is idle, or
  is refused with a clean error (see ``_around_update_weights_from_disk``).
* **A request for a model the server does not serve is answered anyway** (sgl-project/sglang#7035
  and #31404, both closed without a fix; ``/v1/responses`` already checks). AROUND
  ``OpenAIServingCompletion/Chat._validate_request``: such a request gets a 400 naming the served
  model.
"""

from __future__ import annotations

import logging
import time

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

log = logging.getLogger("sglang_rvv")
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
    HookRegistry.register(f"{WEIGHT_UPDATER}.update_weights_from_disk", _around_update_weights_from_disk,
                          HookType.AROUND)
    HookRegistry.register(f"{SCHEDULER}.process_input_requests", _after_process_input_requests, HookType.AFTER)
    for serving in OPENAI_SERVING:
        HookRegistry.register(f"{serving}._validate_request", _around_validate_request, HookType.AROUND)
