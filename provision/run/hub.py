"""What the hub says of each target's model, asked while the facts are gathered: the revision's
commit and files (what each host must still fetch), its config.json and quantization, for weights
the tool fetches and for weights placed by hand. Pinned commits answered before are kept."""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from provision import (
    context,
    inventory,
    kvcache,
    render,
    secrets,
    weights,
)
from provision.errors import HubUnreachable, KvError, WeightsError


def _quantization(model_config: dict[str, Any] | None) -> str | None:
    if model_config is None:
        return None
    try:
        return weights.quantization_of(model_config)
    except WeightsError as exc:
        logging.getLogger("provision.weights").info("quantization unknown: %s", exc)
        return None


HubKey = tuple[str, str, tuple[str, ...], str]  # (model, revision, file patterns, endpoint)


# (the snapshot, or why not: a HubUnreachable where the hub gave no answer at all; config.json)
HubAnswer = tuple["weights.Snapshot | WeightsError", "dict[str, Any] | None"]


def _hub_key(settings: inventory.Settings) -> HubKey:
    return str(settings.model), settings.model_revision, tuple(settings.model_files), settings.hf_endpoint


def _ask_hub(key: HubKey, held: secrets.Secrets) -> HubAnswer:
    """The revision's commit and files, and the model's config.json (None when unreadable), asked with
    the run's hf_token; a refusal names where that token came from."""
    model, revision, files, endpoint = key
    try:
        snapshot = weights.resolve(model, revision, files, endpoint, held.hf_token, held.sources.get("hf_token"))
    except WeightsError as exc:
        return exc, None
    weights.keep_snapshot(snapshot, files, endpoint)
    try:  # known issues and the KV cache estimate
        return snapshot, weights.model_config(snapshot.repo, snapshot.commit, endpoint, held.hf_token)
    except WeightsError as exc:
        logging.getLogger("provision.weights").info("config.json unknown: %s", exc)
        return snapshot, None


def _kept(key: HubKey, token: str | None) -> HubAnswer | None:
    """A pinned commit's files and config.json as the hub gave them before: a plan of hosts that have
    them asks the hub nothing (and loads no hub client). None when the hub must be asked."""
    model, revision, files, endpoint = key
    snapshot = weights.kept_snapshot(model, revision, files, endpoint)
    if snapshot is None:
        return None
    try:
        return snapshot, weights.model_config(model, snapshot.commit, endpoint, token)
    except WeightsError:
        return None


@dataclass(frozen=True)
class HubAnswers:
    """What a plan knows of its models before the facts are in: pinned commits' answers kept from an
    earlier plan, and the hub's answers being asked meanwhile."""

    kept: Mapping[HubKey, HubAnswer] = field(default_factory=dict)
    asking: Mapping[HubKey, Future[HubAnswer]] = field(default_factory=dict)


def ask_early(targets: Sequence[inventory.Settings], held: secrets.Secrets) -> HubAnswers:
    """The targets' models (their settings, in order): each pinned commit answered from what was kept,
    the others asked of the hub in threads of their own, so the hub and the hosts answer at the same time."""
    kept: dict[HubKey, HubAnswer] = {}
    keys = set()
    for settings in targets:
        if not weights.managed(settings):
            continue
        key = _hub_key(settings)
        if key not in kept and key not in keys:
            answer = _kept(key, held.hf_token)
            if answer is None:
                keys.add(key)
            else:
                kept[key] = answer
    if not keys:
        return HubAnswers(kept)
    asking = ThreadPoolExecutor(max_workers=min(8, len(keys)), thread_name_prefix="hub")
    futures = {key: asking.submit(_ask_hub, key, held) for key in keys}
    asking.shutdown(wait=False)
    return HubAnswers(kept, futures)


def with_snapshots(contexts: dict[str, context.Context], held: secrets.Secrets, wanted: set[str],
                    early: HubAnswers) -> dict[str, context.Context]:
    """Ask the hub once per (model, revision, files, endpoint) for the commit and the files' sizes and
    hashes (the answers asked early where the key is the same); each host's context learns what it
    must still fetch (its manifest, read by the probe). A pinned commit's kept answer stands while
    its hosts have it; once one must fetch, the hub is asked, so the gate's model.hub says what the
    hub says now (a repository gone, a token refused)."""
    asked: dict[HubKey, HubAnswer] = {}
    live: set[HubKey] = set()  # answers the hub gave in this run (not kept from an earlier one)
    result = dict(contexts)
    for name, ctx in contexts.items():
        s = ctx.settings
        if name not in wanted or not weights.managed(s) or not s.model:
            continue
        key = _hub_key(s)
        if key not in asked:
            kept = early.kept.get(key) or (None if key in early.asking else _kept(key, held.hf_token))
            if kept is not None:
                asked[key] = kept
            else:
                asked[key] = early.asking[key].result() if key in early.asking else _ask_hub(key, held)
                live.add(key)
        answer, model_config = asked[key]
        if isinstance(answer, WeightsError):
            result[name] = _refused(ctx, answer)
            continue
        reason, to_fetch = weights.compare(answer, weights.host_weights(ctx.facts, weights.root_of(s)))
        if reason and key not in live:  # a host must fetch: the gate asks the hub itself
            live.add(key)
            asked[key] = _ask_hub(key, held)
            answer, model_config = asked[key]
            if isinstance(answer, WeightsError):
                result[name] = _refused(ctx, answer)
                continue
            reason, to_fetch = weights.compare(answer, weights.host_weights(ctx.facts, weights.root_of(s)))
        result[name] = dataclasses.replace(ctx, snapshot=answer, weights_bytes=answer.weight_bytes,
                                           weights_to_fetch=to_fetch, model_config=model_config,
                                           quantization=_quantization(model_config))
    return result


def _refused(ctx: context.Context, error: WeightsError) -> context.Context:
    """Why the hub could not say, and whether it answered at all (model.hub's fix differs)."""
    return dataclasses.replace(ctx, snapshot_error=str(error), hub_unreachable=isinstance(error, HubUnreachable))


def _from_gguf(ctx: context.Context, placed: weights.PlacedModel) -> context.Context:
    """A GGUF model placed by hand (llama.cpp's one file, or a directory holding one GGUF model): the
    weights are its file's size, the KV cache's shape its header's metadata (kvcache.config_from_gguf);
    an architecture that is not mapped leaves the weights alone, and says why. The hub is not asked:
    a GGUF repository has no config.json to give."""
    assert placed.gguf is not None
    weights_from = "the GGUF file's size on the host" if placed.is_file else \
        f"the GGUF files' sizes in {placed.directory} on the host"
    try:
        config = kvcache.config_from_gguf(placed.gguf)
    except KvError as exc:
        return dataclasses.replace(ctx, weights_bytes=placed.weight_bytes, weights_from=weights_from,
                                   model_config_note=f"the GGUF header of {placed.gguf_file}: {exc}")
    return dataclasses.replace(ctx, model_config=config, weights_bytes=placed.weight_bytes,
                               weights_from=weights_from,
                               model_config_from=f"the GGUF header of {placed.gguf_file}")


def with_placed_weights(contexts: dict[str, context.Context], held: secrets.Secrets,
                         wanted: set[str]) -> dict[str, context.Context]:
    """Hosts whose weights the tool does not fetch learn the model's config.json and weight bytes for
    the memory fit: from the model directory on the host (read by the probe; a GGUF model's header
    stands for config.json where the directory has none, or where the model is one GGUF file), else,
    for a hub repository id, from the hub (once per model, revision, files and endpoint); where neither has
    them, why (the gate says it instead of nothing). The hub's refusal blocks nothing here: the
    weights are the host's own."""
    asked: dict[HubKey, HubAnswer] = {}
    result = dict(contexts)
    for name, ctx in contexts.items():
        s = ctx.settings
        if name not in wanted or not s.model or weights.managed(s):
            continue
        directory = render.model_path(s)
        placed = weights.placed_model(ctx.facts, directory)
        if placed is not None and placed.config is not None:
            result[name] = dataclasses.replace(
                ctx, model_config=placed.config, quantization=_quantization(dict(placed.config)),
                weights_bytes=placed.weight_bytes, model_config_from=f"{directory}/config.json on the host",
                weights_from=f"file sizes in {directory} on the host" if placed.weight_bytes else None)
            continue
        if placed is not None and placed.gguf is not None:
            result[name] = _from_gguf(ctx, placed)
            continue
        on_host = placed.config_error if placed is not None else f"{directory} was not inspected"
        if str(s.model).startswith("/"):
            result[name] = dataclasses.replace(ctx, model_config_note=(
                f"{on_host}, and the model is a path, not a hub repository id"))
            continue
        key = _hub_key(s)
        if key not in asked:
            asked[key] = _kept(key, held.hf_token) or _ask_hub(key, held)
        answer, model_config = asked[key]
        if isinstance(answer, WeightsError):
            result[name] = dataclasses.replace(ctx, model_config_note=f"{on_host}; the hub: {answer}")
        elif model_config is None:
            result[name] = dataclasses.replace(
                ctx, weights_bytes=answer.weight_bytes, weights_from=f"hub file sizes of {answer.repo}",
                model_config_note=f"{on_host}; the hub gave no readable config.json of {answer.repo}")
        else:
            result[name] = dataclasses.replace(
                ctx, model_config=model_config, quantization=_quantization(model_config),
                weights_bytes=answer.weight_bytes, weights_from=f"hub file sizes of {answer.repo}",
                model_config_from=f"the hub ({answer.repo}@{answer.commit[:12]}; {on_host})")
    return result
