"""The gate: the field's checklist for Blackwell (and Hopper) hosts, as pure rules over facts + settings.

Every rule looks at facts already gathered and at the host's resolved settings, and answers a Finding:
an id, a severity (what failing means), a status (pass, fail, skip where it does not apply), a message,
the evidence it looked at and the fix. A rule that cannot see what it needs fails with "could not be
checked": a gate that guesses is no gate. Some rules resolve a conflict instead of failing; their
Finding carries the resolution (extra server arguments) that rendering applies.

Sources are the sections of blackwell-facts (kept with the project's shared notes) named in each docstring.
"""
from __future__ import annotations

import ipaddress
import math
import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from provision import (
    affinity,
    catalog,
    contracts,
    driver_installs,
    endpoints,
    hardening,
    hints,
    index_gaps,
    issue_evidence,
    known_issues,
    kvcache,
    python_floors,
    render,
    venv,
    venvreqs,
)
from provision import cuda as cuda_builds
from provision.context import Context, cluster_network_of, flag_value, visible
from provision.engines import Engine, Verdict, engine_of
from provision.engines.llamacpp import gguf_models
from provision.engines.trtllm import TRTLLM
from provision.engines.vllm import vllm_version
from provision.errors import AffinityError, KvError, ProvisionError
from provision.facts import DROP_IN_DIRS, MANAGED_UNITS, VENV_MANIFEST
from provision.inventory import VAR_SPECS, Settings
from provision.render import model_path
from provision.weights import unreachable_fix

BLOCKER, WARNING, INFO = "blocker", "warning", "info"
PASS, FAIL, SKIP, FORCED = "pass", "fail", "skip", "forced"

DMABUF_MIN_KERNEL = (5, 12)  # RDMA dma-buf needs Linux 5.12 (facts section 3)
OS_HEADROOM_BYTES = 8 * 2**30  # what a unified-memory host keeps for itself besides vLLM
KV_HEADROOM = 0.85  # weights above this share of the budget leave too little for the KV cache
MAX_DISCRETE_UTILIZATION = 0.95  # above this a discrete GPU has no room left for the CUDA context itself
PIP_NCCL_WEDGE = "known.spark-pip-nccl-allreduce-wedge"  # provision/known_issues.yaml
VLLM_PYTHON = ((3, 10), (3, 13))  # the Python versions vLLM publishes wheels for


@dataclass(frozen=True)
class Finding:
    id: str
    severity: str
    status: str
    message: str
    evidence: Mapping[str, Any] = field(default_factory=dict)
    fix: str | None = None
    resolution: Mapping[str, Any] = field(default_factory=dict)

    @property
    def blocks(self) -> bool:
        return self.status == FAIL and self.severity == BLOCKER


Rule = Callable[[Context], Finding]
RULES: list[tuple[str, str, Rule]] = []
RULE_ENGINES: dict[str, tuple[str, ...] | None] = {}  # rule id -> the engines it reads (None: every engine)


def rule(rule_id: str, severity: str, engines: tuple[str, ...] | None = None,
         ) -> Callable[[Callable[[Context], Finding | None]], Rule]:
    """Register a rule; a rule returning None does not apply to this host (skip). `engines` names the
    engines whose flags or environment it reads (None: every engine)."""

    def register(function: Callable[[Context], Finding | None]) -> Rule:
        def run(ctx: Context) -> Finding:
            if engines is not None and ctx.settings.engine not in engines:
                return Finding(rule_id, severity, SKIP, f"does not apply to the {ctx.settings.engine} engine")
            found = function(ctx)
            if found is None:
                return Finding(rule_id, severity, SKIP, "does not apply to this host")
            return replace(found, id=rule_id, severity=found.severity or severity)

        run.__doc__ = function.__doc__
        RULES.append((rule_id, severity, run))
        RULE_ENGINES[rule_id] = engines
        return run

    return register


def ok(message: str, **evidence: Any) -> Finding:
    return Finding("", "", PASS, message, evidence)


def fail(message: str, fix: str | None = None, **evidence: Any) -> Finding:
    return Finding("", "", FAIL, message, evidence, fix)


def warn(message: str, fix: str | None = None, **evidence: Any) -> Finding:
    """A failure that only warns, from a rule whose worst case blocks."""
    return Finding("", WARNING, FAIL, message, evidence, fix)


def unknown(what: str, ctx: Context, fact: str) -> Finding:
    note = ctx.facts.notes.get(fact, "no value")
    return Finding("", "", FAIL, f"could not be checked: {what} unknown ({note})", {fact: None},
                   f"make `{fact}` readable on the host (see `{hints.command(f'facts --host {ctx.host}')}`)")


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text.split("-")[0]))


# ---------------------------------------------------------------------------------------------
# Kernel and driver


@rule("kernel.version", BLOCKER)
def kernel_version(ctx: Context) -> Finding:
    """Kernel per profile: 6.14+ on RTX 5090 workstations; DGX OS ships 6.11/6.17 "-nvidia" kernels, which
    are accepted on Spark (facts section 1, "DGX Spark driver/kernel pairs observed")."""
    release = ctx.facts.kernel
    if release is None:
        return unknown("kernel release", ctx, "uname")
    expectation = ctx.profile.kernel
    if any(re.match(pattern, release) for pattern in expectation.also_accepted):
        return ok(f"{release} is an accepted vendor kernel", kernel=release)
    if version_tuple(release)[:2] >= version_tuple(expectation.minimum)[:2]:
        return ok(f"{release} >= {expectation.minimum}", kernel=release, minimum=expectation.minimum)
    return fail(f"kernel {release} is older than {expectation.minimum}, the minimum for {ctx.profile.name}",
                f"install a {expectation.minimum}+ kernel (Ubuntu 24.04: apt-get install "
                "linux-generic-hwe-24.04) and reboot", kernel=release, minimum=expectation.minimum)


@rule("driver.loaded", BLOCKER)
def driver_loaded(ctx: Context) -> Finding | None:
    """An NVIDIA kernel module must be loaded for any GPU profile (/proc/driver/nvidia/version exists)."""
    if ctx.profile.driver is None:
        return None
    if ctx.facts.driver is None:
        return fail("no NVIDIA kernel module is loaded", driver_fix(ctx, "driver.loaded", "580"),
                    nvidia_driver=ctx.facts.notes.get("nvidia_driver"))
    return ok(f"NVIDIA {ctx.facts.driver.version} loaded", version=ctx.facts.driver.version)


@rule("driver.flavour", BLOCKER)
def driver_flavour(ctx: Context) -> Finding | None:
    """Blackwell needs the open kernel modules: "Blackwell and later are only supported by the open kernel
    modules"; the proprietary flavour fails with RmInitAdapter / Xid 169 on GB10 (facts section 1)."""
    expectation = ctx.profile.driver
    if expectation is None or ctx.facts.driver is None or expectation.flavour == "any":
        return None
    found = ctx.facts.driver.flavour
    if found == expectation.flavour:
        return ok(f"{found} kernel module", flavour=found)
    major = ctx.facts.driver.version.split(".")[0]
    return fail(f"the {found} kernel module is loaded; {ctx.profile.name} needs the {expectation.flavour} one",
                driver_fix(ctx, "driver.flavour", major, "replaces the proprietary modules"),
                flavour=found, required=expectation.flavour)


def _prepared(ctx: Context, rule_id: str) -> bool:
    """Whether `prepare` fixes this rule on this host's profile and OS (prepare.yaml)."""
    from importlib import resources

    from provision import datafiles
    release = ctx.facts.os
    if release is None or not release.version_id:
        return False
    fixes = datafiles.load(resources.files("provision").joinpath("prepare.yaml").read_text(encoding="utf-8"))
    by_os = fixes["fixes"].get(ctx.profile.name) or {}
    return rule_id in (by_os.get(f"{release.id}-{release.version_id}") or {})


def driver_fix(ctx: Context, rule_id: str, branch: str, why: str = "") -> str:
    """The NVIDIA driver with open kernel modules, as the host's own distribution gets it: Ubuntu's
    nvidia-driver-BRANCH-open, with `prepare` named where it installs it; Debian 12 and 13 NVIDIA's own
    repository's nvidia-open (driver_installs.yaml, NVIDIA's driver installation guide), as Debian's own
    packages of the driver (nvidia-open-kernel-dkms: 535 on Debian 12) lag the branches these GPUs need;
    any other the guide itself, which gives each distribution's own commands."""
    release = ctx.facts.os
    then = f" ({why})" if why else ""
    if release is not None and release.id == "ubuntu":
        fix = f"apt-get install nvidia-driver-{branch}-open{then} and reboot"
        if _prepared(ctx, rule_id):
            fix = f"`{hints.command(f'prepare --host {ctx.host}')}` does it: {fix}"
        return fix
    name = (release.pretty_name or release.id) if release is not None else "this host's distribution"
    wanted = f"install NVIDIA's driver {branch} or later with its open kernel modules{then}: on {name}, "
    found = driver_installs.steps_for(release.id, release.version_id or "") if release is not None else None
    if found is None:
        return f"{wanted}as NVIDIA's driver installation guide gives it ({driver_installs.GUIDE}), then reboot"
    steps, source = found
    return f"{wanted}{steps}, then reboot (NVIDIA's driver installation guide: {source})"


def cuda_to_run(ctx: Context) -> tuple[str | None, str]:
    """The CUDA the server will really run, and what says so: the wheels a planned install brings, else
    the venv's torch, else the `cuda_version` setting. (None, why) for a CPU build of torch."""
    planned = ctx.planned_wheels
    if planned is not None:
        return planned.cuda, f"wheels to install: {planned.evidence}"
    venv = ctx.facts.venv
    if venv is not None and venv.torch:
        return venv.cuda, f"the venv's torch {venv.torch} ({ctx.settings.venv_dir})"
    return ctx.settings.cuda_version, "setting cuda_version"


@rule("driver.version", BLOCKER)
def driver_version(ctx: Context) -> Finding | None:
    """Driver at least the profile's minimum and the minimum for the CUDA the server will run: the venv's
    torch (or the wheels about to replace it) when known, not only the configured `cuda_version`
    (NVIDIA CUDA release notes Table 3, provision/cuda_drivers.yaml; facts sections 1 and 2). A driver
    below that release's row, or a release newer than the table, that meets NVIDIA's minor-version
    compatibility minimum of its CUDA major (13.x: 580) warns instead: NVIDIA documents the build as
    running with a limited feature set, PTX from the newer toolkit not JIT-compiled (vllm #47397)."""
    expectation = ctx.profile.driver
    if expectation is None or ctx.facts.driver is None:
        return None
    cuda, cuda_from = cuda_to_run(ctx)
    needed = expectation.minimum
    found = ctx.facts.driver.version
    evidence: dict[str, Any] = {"driver": found, "minimum": needed, "cuda": cuda, "cuda_from": cuda_from}
    if cuda:
        table = cuda_builds.driver_table()
        for_cuda = table.releases.get(cuda)
        minor = cuda_builds.minor_compatibility(cuda)
        if for_cuda is None and minor is None:
            known = ", ".join(table.releases)
            return fail(f"CUDA {cuda} ({cuda_from}) is not in the driver table ({known})",
                        "use a build for one of those CUDA releases, or add the release to "
                        "provision/cuda_drivers.yaml from NVIDIA's table", **evidence)
        if for_cuda is not None:
            needed = max(needed, for_cuda, key=version_tuple)
            evidence.update(minimum=needed, source=table.source_of(cuda))
        if minor is not None and (for_cuda is None or version_tuple(found) < version_tuple(needed)):
            evidence.update(minor_version_minimum=minor.driver, minor_version_source=minor.source)
            if version_tuple(found) >= max(version_tuple(expectation.minimum), version_tuple(minor.driver)):
                return _minor_version_compatible(cuda, cuda_from, found, for_cuda, minor, evidence)
            if for_cuda is None:
                needed = max(needed, minor.driver, key=version_tuple)
                evidence.update(minimum=needed, source=minor.source)
                if version_tuple(found) < version_tuple(minor.driver):
                    return fail(f"driver {found} cannot run CUDA {cuda} ({cuda_from}): no CUDA {minor.major}.x "
                                f"build runs on a driver older than {minor.driver} (NVIDIA's minor-version "
                                f"compatibility), and CUDA {cuda} is newer than the driver table",
                                f"install driver {minor.driver} or newer"
                                + _older_build(found), **evidence)
    if version_tuple(found) >= version_tuple(needed):
        return ok(f"driver {found} >= {needed}" + (f" (CUDA {cuda}: {cuda_from})" if cuda else ""), **evidence)
    if cuda and version_tuple(found) >= version_tuple(expectation.minimum):
        return fail(f"driver {found} cannot run CUDA {cuda} ({cuda_from}): CUDA {cuda} needs driver "
                    f"{needed} or newer",
                    f"install driver {needed} or newer (nvidia-driver-580-open covers CUDA up to 13.0)"
                    + _older_build(found), **evidence)
    return fail(f"driver {found} is older than {needed} (needed on {ctx.profile.name}"
                + (f" and for CUDA {cuda}: {cuda_from})" if cuda else ")"),
                f"install driver {needed} or newer (nvidia-driver-580-open covers CUDA up to 13.0)",
                **evidence)


def _older_build(driver: str) -> str:
    """', or a torch/vLLM build for CUDA 12.9 or older (cu129: set cuda_version 12.9)': the newest CUDA
    release the driver runs fully, or '' where it runs none."""
    runs = cuda_builds.newest_cuda_for(driver)
    if runs is None:
        return ""
    return f", or a torch/vLLM build for CUDA {runs} or older (cu{runs.replace('.', '')}: set cuda_version {runs})"


def _minor_version_compatible(cuda: str, cuda_from: str, found: str, for_cuda: str | None,
                              minor: cuda_builds.MinorCompatibility, evidence: dict[str, Any]) -> Finding:
    """A warning, not a pass: the build runs on this driver only under NVIDIA's minor-version
    compatibility, whose limits fall on kernels that reach the GPU as PTX."""
    if for_cuda is not None:
        below = f"driver {found} is older than {for_cuda}, the driver NVIDIA lists for CUDA {cuda} ({cuda_from})"
        lift = f"install driver {for_cuda} or newer to lift the limit"
    else:
        rows = [release for release in cuda_builds.driver_table().releases
                if release.split(".")[0] == minor.major]
        newest = max(rows, key=version_tuple) if rows else None
        below = (f"CUDA {cuda} ({cuda_from}) is newer than the driver table"
                 + (f" (its newest CUDA {minor.major} row: {newest}, driver "
                    f"{cuda_builds.minimum_driver(newest)})" if newest else "")
                 + ": the driver its toolkit needs is not known here")
        lift = (f"install the driver NVIDIA's release notes list for CUDA {cuda} (Table 3) to lift the limit, "
                "and add that row to provision/cuda_drivers.yaml")
    jit = "cannot" if for_cuda is not None else "may not"
    return warn(f"{below}; it runs under NVIDIA's minor-version compatibility (any CUDA {minor.major}.x build on "
                f"driver {minor.driver} or newer) with a limited feature set: this driver {jit} JIT-compile "
                f"PTX that CUDA {cuda} built, and calls that need a newer driver fail "
                "(cudaErrorCallRequiresNewerDriver)",
                "a kernel that reaches this GPU only as PTX (no cubin for its architecture in the wheel, as "
                "vLLM's FlashAttention 2 on sm_121, vllm #47397) fails to load with "
                f"cudaErrorUnsupportedPtxVersion: {lift}" + _older_build(found),
                compatibility="minor-version", **evidence)


@rule("driver.nouveau", BLOCKER)
def driver_nouveau(ctx: Context) -> Finding | None:
    """nouveau must not be loaded next to (or instead of) the NVIDIA driver."""
    if ctx.profile.driver is None:
        return None
    if ctx.facts.modules is None:
        # The NVIDIA driver owning the GPUs rules nouveau out for them; only the list is missing.
        return warn(f"loaded modules unknown ({ctx.facts.notes.get('modules', 'no value')})",
                    "make /proc/modules readable", modules=None) if ctx.facts.driver else \
            unknown("loaded modules", ctx, "modules")
    if "nouveau" in ctx.facts.modules:
        return fail("the nouveau module is loaded",
                    "echo 'blacklist nouveau' > /etc/modprobe.d/blacklist-nouveau.conf; "
                    "update-initramfs -u; reboot", modules=["nouveau"])
    return ok("nouveau not loaded")


# ---------------------------------------------------------------------------------------------
# GPUs and memory


@rule("gpu.present", BLOCKER)
def gpu_present(ctx: Context) -> Finding | None:
    """The profile's GPU must be visible to nvidia-smi."""
    if ctx.profile.gpu is None:
        return None
    if ctx.facts.gpus is None:  # an answer nobody can read is not "no GPU"
        return unknown("GPUs", ctx, "gpus")
    if not ctx.facts.gpus:
        return fail(f"no GPU visible: {ctx.facts.notes.get('gpus', 'nvidia-smi lists none')}",
                    "check the driver (nvidia-smi) and that the card is seated and powered",
                    gpus=0)
    return ok(f"{len(ctx.facts.gpus)} GPU(s) visible", gpus=[gpu.name for gpu in ctx.facts.gpus])


@rule("gpu.compute_capability", BLOCKER)
def gpu_compute_capability(ctx: Context) -> Finding | None:
    """Every GPU's compute capability matches the profile (sm_120 RTX 5090, sm_121 GB10, sm_90 Hopper)."""
    if ctx.profile.gpu is None or not ctx.facts.gpus:
        return None
    expected = ctx.profile.gpu.compute_capability
    found = sorted({gpu.compute_cap or "unknown" for gpu in ctx.facts.gpus})
    if found == [expected]:
        return ok(f"compute capability {expected}", compute_cap=found)
    return fail(f"compute capability {', '.join(found)} does not match profile {ctx.profile.name} "
                f"({expected})", "use the profile that matches this hardware (--profile or the inventory)",
                compute_cap=found, expected=expected)


@rule("gpu.count", BLOCKER)
def gpu_count(ctx: Context) -> Finding | None:
    """The host has at least as many GPUs as its share of TP x PP."""
    if ctx.profile.gpu is None:
        return None
    needed, remainder = divmod(ctx.parallel, ctx.nodes)
    if remainder:
        return fail(f"TP x PP = {ctx.parallel} does not divide over {ctx.nodes} nodes",
                    "choose tensor/pipeline parallel sizes that are a multiple of the node count",
                    tensor_parallel_size=ctx.settings.tensor_parallel_size,
                    pipeline_parallel_size=ctx.settings.pipeline_parallel_size, nodes=ctx.nodes)
    if ctx.facts.gpus is None:
        return unknown("GPU count", ctx, "gpus")
    have = len(ctx.visible_gpus)  # a service's own GPUs (CUDA_VISIBLE_DEVICES), else all of them
    evidence = {"gpus": have, "needed": needed, "tensor_parallel_size": ctx.settings.tensor_parallel_size,
                "pipeline_parallel_size": ctx.settings.pipeline_parallel_size, "nodes": ctx.nodes}
    if have >= needed:
        return ok(f"{have} GPU(s) for {needed} needed", **evidence)
    return fail(f"{have} GPU(s) but TP x PP needs {needed} on this host", _gpu_count_fix(ctx, have), **evidence)


def _gpu_count_fix(ctx: Context, have: int) -> str:
    """A setting that fits the GPUs there are, never the one in effect: with none visible, no setting
    does (TP 1 is the least there is); a TP below the one asked for that TP x PP fits on each node, else
    the pipeline parallel size that does."""
    if have == 0:
        return ("no GPU is visible to it (see gpu.present): make them visible (`nvidia-smi` on the host; a "
                "service's gpus) or serve it on a host with GPUs")
    pipeline = ctx.settings.pipeline_parallel_size
    fits = have * ctx.nodes // pipeline
    if fits:
        return f"--set tensor_parallel_size={fits} or add GPUs"
    tensor = "" if ctx.settings.tensor_parallel_size == 1 else " --set tensor_parallel_size=1"
    return f"--set pipeline_parallel_size={have * ctx.nodes}{tensor} or add GPUs"


@rule("cluster.topology", BLOCKER)
def cluster_topology(ctx: Context) -> Finding | None:
    """Across a multi-node cluster, nodes x GPUs per node = TP x PP (checked once, on the head)."""
    if ctx.cluster is None or not ctx.cluster.multi_node or ctx.host != ctx.cluster.head:
        return None
    unread = sorted(name for name, facts in ctx.peers.items() if facts.gpus is None)
    if unread:
        return fail(f"could not be checked: the GPUs of {', '.join(unread)} could not be read",
                    f"make nvidia-smi readable there (see `{hints.command('facts')}`)", unreadable=unread)
    per_node = {name: len(facts.gpus or ()) for name, facts in ctx.peers.items()}
    total = sum(per_node.values())
    if len(per_node) < ctx.nodes:
        missing = sorted(set(ctx.cluster.hosts) - set(per_node))
        return fail(f"no facts from {', '.join(missing)}", "bring those nodes up and check again",
                    gpus_per_node=per_node)
    if total == ctx.parallel and len(set(per_node.values())) == 1:
        return ok(f"{ctx.nodes} nodes x {total // ctx.nodes} GPU(s) = TP x PP {ctx.parallel}",
                  gpus_per_node=per_node)
    return fail(f"{ctx.nodes} nodes with {per_node} GPUs do not make TP x PP = {ctx.parallel}",
                f"--set tensor_parallel_size={total} (or use pipeline_parallel_size across nodes)",
                gpus_per_node=per_node, parallel=ctx.parallel)


def estimate_weights_bytes(model: str | None) -> tuple[int, str] | None:
    """Weights size from the model's name when hub metadata is not known: '32B' and 'AWQ' -> 4 bits."""
    if not model:
        return None
    match = re.search(r"(?<![\d.])(\d+(?:\.\d+)?)[Bb](?![a-zA-Z])", model)
    if not match:
        return None
    params = float(match.group(1)) * 1e9
    name = model.lower()
    bits = 4 if re.search(r"awq|gptq|int4|4bit|w4a16|nvfp4", name) else (
        8 if re.search(r"fp8|int8|8bit|w8a8", name) else 16)
    # Quantized checkpoints keep embeddings and norms in 16 bit: about 8 % on top.
    return int(params * bits / 8 * 1.08), f"estimated from the name: {match.group(1)}B parameters x {bits} bit"


@rule("memory.fits", BLOCKER)
def memory_fits(ctx: Context) -> Finding | None:
    """Each GPU holds its share of the weights, a runtime allowance and the KV cache of one sequence of
    max_model_len (provision/kvcache.py, from the model's config.json and the hub's file sizes, or a
    placed GGUF file's header and size on the host); warns
    below MIN_CONCURRENT_SEQUENCES such sequences. llama.cpp allocates the KV cache of all its slots at
    start: there concurrent_sequences slots of max_model_len (unset: the model's context) must fit, and a
    fail names the most slots and the longest max_model_len that do. On GB10 the budget comes from
    /proc/meminfo, never from nvidia-smi's [N/A] (facts sections 1 and 5); on vLLM's CPU build it is
    VLLM_CPU_KVCACHE_SPACE. Without config.json from the host or the hub, a starter model's shape shipped
    in provision/starter_models.yaml (the one `init` judges it by) stands in; for any other model the
    weights alone can fail or warn, but never pass: the KV cache unknown, the finding is an info that
    says why and how to get config.json."""
    if ctx.profile.gpu is None:
        return _cpu_kv_space(ctx)
    if not ctx.facts.gpus:
        return None
    known = (ctx.weights_bytes, ctx.weights_from or "hub file sizes") if ctx.weights_bytes \
        else estimate_weights_bytes(ctx.settings.model)
    if known is None:
        if ctx.model_config_note is None:
            return None
        return warn(f"could not be estimated: {ctx.model_config_note}", _unknown_model_fix(ctx),
                    kv_cache=f"not estimated: {ctx.model_config_note}")
    weights, how = known
    budget = _gpu_budget(ctx)
    if isinstance(budget, Finding):
        return budget
    budget_bytes, source = budget
    shape, config_from = _model_shape(ctx)
    if shape is None:
        return _weights_only(ctx, weights, how, budget_bytes, source, config_from)
    length, length_from = _context_length(ctx, shape)
    layout = kvcache.Layout(int(ctx.settings.tensor_parallel_size), int(ctx.settings.pipeline_parallel_size))
    est = kvcache.estimate(shape, layout, weights_total=weights, budget=int(budget_bytes), max_model_len=length,
                           args=ctx.extra_args)
    evidence = {**est.as_evidence(), "weights_from": how, "budget_from": source, "attention": shape.attention,
                "max_model_len_from": length_from, "config_from": config_from}
    terms = (f"per GPU {_gib(est.weights)} weights + {_gib(est.allowance)} allowance of {_gib(est.budget)}; "
             f"KV {est.kv_per_token / 1024:g} KiB/token ({shape.attention}, {est.kv_dtype})")
    slots = engine_of(ctx.settings).kv_slots(ctx.settings, length)
    if slots is not None:
        return _slots_fit(ctx, shape, layout, est, slots, terms, evidence)
    if not est.fits:
        return fail(f"{terms}: one sequence of {length} tokens needs {_gib(est.kv_per_sequence)} of KV cache, "
                    f"{_gib(max(0, est.kv_budget))} is left", _fit_fixes(ctx, shape, layout, est, weights, 1),
                    **evidence)
    summary = (f"{terms}; {_gib(est.kv_budget)} left holds {est.context_tokens:,} tokens, "
               f"{est.concurrent_sequences:.1f} sequences of {length}")
    if est.concurrent_sequences < kvcache.MIN_CONCURRENT_SEQUENCES:
        return warn(f"{summary}: fewer than {kvcache.MIN_CONCURRENT_SEQUENCES} full-length sequences at once",
                    _fit_fixes(ctx, shape, layout, est, weights, kvcache.MIN_CONCURRENT_SEQUENCES), **evidence)
    return ok(summary, **evidence)


def _gib(value: float) -> str:
    return f"{value / 2**30:.1f} GiB"


def _slots_fit(ctx: Context, shape: kvcache.ModelShape, layout: kvcache.Layout, est: kvcache.Estimate,
               slots: tuple[int, int], terms: str, evidence: Mapping[str, Any]) -> Finding:
    """A server that allocates every slot's KV cache at its start (llama.cpp, engines/llamacpp.py SLOTS)
    fits when all of its slots do, each at the context it holds; where they do not, the most slots of
    that context and the longest max_model_len for that many slots that fit."""
    count, tokens = slots
    _, kv_bytes = kvcache.kv_dtype(shape, ctx.extra_args)
    per_slot = kvcache.sequence_bytes(shape, layout, kv_bytes, tokens)
    need = count * per_slot
    fitting = max(0, est.kv_budget) // per_slot if per_slot else count
    # The server's KV cache is its slots' (status shows it beside the server's own figure), and the
    # sequences it serves at once are its slots: the pool estimate's count of them would read as the setting.
    evidence = {**{key: value for key, value in evidence.items() if key != "concurrent_sequences"},
                "context_tokens": count * tokens, "slots": count, "slot_tokens": tokens, "slots_that_fit": fitting,
                "kv_per_slot_gib": round(per_slot / kvcache.GIB, 3), "kv_all_slots_gib": round(need / kvcache.GIB, 3)}
    if not ctx.settings.max_model_len:
        evidence["max_model_len_from"] = (f"max_model_len not set: each slot holds the model's context "
                                          f"({est.max_model_len:,} tokens; --ctx-size 0)")
    said = f"{count} slots x {tokens:,} tokens need {_gib(need)} of KV cache"
    if est.kv_budget >= need:
        return ok(f"{terms}; {said}, {_gib(est.kv_budget)} is left", **evidence)
    fixes = []
    fewer = min(fitting, count - 1)
    if fewer >= 1:
        fixes.append(f"--set concurrent_sequences={fewer} ({fewer} slots of {tokens:,} tokens)")
    longest = kvcache.largest_context(shape, layout, kv_bytes, est.kv_budget // count)
    if longest >= 256:
        fixes.append(f"--set max_model_len={longest} ({count} slots of {longest:,} tokens)")
    fix = " or ".join(fixes) if fixes else "a smaller or more quantized model, or a GPU with more memory"
    return fail(f"{terms}: {said}, {_gib(max(0, est.kv_budget))} is left", fix, **evidence)


def _gpu_budget(ctx: Context) -> tuple[float, str] | Finding:
    """What vLLM may take on each GPU: gpu_memory_utilization of the smallest GPU, or on unified memory
    the smaller of that share of RAM and MemAvailable less the host's headroom."""
    utilization = float(ctx.settings.gpu_memory_utilization)
    assert ctx.profile.gpu is not None
    if ctx.profile.gpu.unified_memory:
        if ctx.facts.memory is None:
            return unknown("memory", ctx, "meminfo")
        return (min(ctx.facts.memory.available - OS_HEADROOM_BYTES, ctx.facts.memory.total * utilization),
                "MemAvailable - host headroom (unified memory)")
    sizes = [gpu.memory_total_mib for gpu in ctx.visible_gpus]
    if None in sizes or not sizes:
        return unknown("GPU memory", ctx, "gpus")
    return min(size for size in sizes if size is not None) * 2**20 * utilization, \
        "smallest GPU's memory x gpu_memory_utilization"


def _model_shape(ctx: Context) -> tuple[kvcache.ModelShape | None, str]:
    """The model's shape and where its config.json came from, or None and why it is not known. Where
    neither the host nor the hub gave config.json, the shape the package ships for that model
    (kvcache.known_models: what `init` judges it by) stands in, and the evidence says so."""
    config, source = ctx.model_config, ctx.model_config_from or "the hub"
    if config is None:
        why = ctx.model_config_note or "no config.json from the hub"
        shipped = kvcache.known_model(str(ctx.settings.model) if ctx.settings.model else None)
        if shipped is None:
            return None, why
        config, source = shipped.config, (f"the shape shipped in provision/{kvcache.MODELS_FILE} (read from "
                                          f"{shipped.source}; {why})")
    try:
        return kvcache.shape_of(config), source
    except KvError as exc:
        return None, str(exc)


def _context_length(ctx: Context, shape: kvcache.ModelShape) -> tuple[int, str]:
    if ctx.settings.max_model_len:
        return int(ctx.settings.max_model_len), "max_model_len"
    if shape.max_position_embeddings:
        return shape.max_position_embeddings, "max_model_len not set: the model's max_position_embeddings"
    return 4096, "max_model_len not set and config.json names no length: 4096 assumed"


def _unknown_model_fix(ctx: Context) -> str:
    """Where neither the host's model directory nor the hub gives config.json and the weights' sizes."""
    return (f"place the model's config.json and weights in {model_path(ctx.settings)} on the host, or name "
            "a hub repository id as model (the hub then gives them)")


def _config_fix(ctx: Context) -> str:
    """How the gate gets config.json: from the hub (reachable, the token allowed) or placed on the host."""
    return (f"let the hub give {ctx.settings.model}'s config.json (reachable from this machine: the network, a "
            f"proxy or hf_endpoint; hf_token where the model is gated), or place it in {model_path(ctx.settings)} "
            "on the host; then check again")


def _weights_only(ctx: Context, weights: int, how: str, budget: float, source: str, why: str) -> Finding:
    """Where config.json is not known: the weights alone against the budget. Too large fails and too
    close warns, as before the KV estimate; room left is no pass (the KV cache may not fit in it): the
    verdict is unknown, an info finding that says why and how to get config.json."""
    share = weights / ctx.parallel
    evidence = {"weights_gib": round(weights / 2**30, 1), "per_gpu_gib": round(share / 2**30, 1),
                "budget_gib": round(budget / 2**30, 1), "weights_from": how, "budget_from": source,
                "kv_cache": f"not estimated: {why}"}
    if share > budget:
        return fail(f"{evidence['per_gpu_gib']} GiB of weights per GPU exceed the {evidence['budget_gib']} GiB "
                    "budget", "raise tensor_parallel_size, use a smaller or more quantized model", **evidence)
    if share > budget * KV_HEADROOM:
        return warn(f"weights take {share / budget:.0%} of the budget: little room for the KV cache "
                    f"(not estimated: {why})", "lower max_model_len or raise tensor_parallel_size", **evidence)
    # The weights fit, but a verdict on the KV cache would be a guess: unknown, not a pass.
    return Finding("", INFO, FAIL, f"could not be judged: the KV cache was not estimated ({why}); the weights "
                   f"alone take {evidence['per_gpu_gib']} GiB per GPU of {evidence['budget_gib']} GiB",
                   evidence, _config_fix(ctx))


def _fit_fixes(ctx: Context, shape: kvcache.ModelShape, layout: kvcache.Layout, est: kvcache.Estimate,
               weights: int, sequences: int) -> str:
    """What would make `sequences` full-length sequences fit: the largest max_model_len, a larger TP this
    host has GPUs for, or a gpu_memory_utilization (never above the unified-memory headroom rule)."""
    _, kv_bytes = kvcache.kv_dtype(shape, ctx.extra_args)
    fixes = []
    longest = kvcache.largest_context(shape, layout, kv_bytes, est.kv_budget // sequences)
    if longest >= 256:
        fixes.append(f"--set max_model_len={longest}")
    gpus = len(ctx.facts.gpus or ()) * ctx.nodes
    for tp in (2, 4, 8):
        if layout.tensor_parallel < tp <= gpus // layout.pipeline_parallel:
            wider = kvcache.estimate(shape, kvcache.Layout(tp, layout.pipeline_parallel), weights_total=weights,
                                     budget=est.budget, max_model_len=est.max_model_len, args=ctx.extra_args)
            if wider.concurrent_sequences >= sequences:
                fixes.append(f"--set tensor_parallel_size={tp}")
                break
    needed = est.weights + est.allowance + est.kv_per_sequence * sequences
    utilization = _utilization_for(ctx, needed)
    if utilization is not None:
        fixes.append(f"--set gpu_memory_utilization={utilization}")
    if not fixes:
        return "a smaller or more quantized model, or more GPUs (tensor_parallel_size)"
    return " or ".join(fixes) + (" (fewer concurrent full-length sequences, or)" if sequences > 1 else "")


def _utilization_for(ctx: Context, needed: float) -> float | None:
    """The gpu_memory_utilization that gives `needed` bytes per GPU, where the host allows it: at most
    0.95 of a discrete GPU; on unified memory never past MemAvailable less the host's headroom."""
    assert ctx.profile.gpu is not None
    if ctx.profile.gpu.unified_memory:
        memory = ctx.facts.memory
        if memory is None or needed > memory.available - OS_HEADROOM_BYTES:
            return None
        wanted = math.ceil(needed / memory.total * 100) / 100
    else:
        smallest = min(gpu.memory_total_mib or 0 for gpu in ctx.facts.gpus or ()) * 2**20
        wanted = math.ceil(needed / smallest * 100) / 100 if smallest else 1.0
        if wanted > MAX_DISCRETE_UTILIZATION:
            return None
    return wanted if wanted > float(ctx.settings.gpu_memory_utilization) else None


def _cpu_kv_space(ctx: Context) -> Finding | None:
    """vLLM's CPU build: the KV cache is VLLM_CPU_KVCACHE_SPACE GiB, apart from the weights."""
    space = ctx.env("VLLM_CPU_KVCACHE_SPACE")
    shape, why = _model_shape(ctx)
    if shape is None and space and ctx.model_config_note:
        return warn(f"could not be estimated: {why}", _unknown_model_fix(ctx), kv_cache=f"not estimated: {why}")
    if shape is None or not space:
        return None
    try:
        budget = int(float(space) * 2**30)
    except ValueError:
        return fail(f"VLLM_CPU_KVCACHE_SPACE={space!r} is not a number of GiB", "set it to a whole number of GiB",
                    VLLM_CPU_KVCACHE_SPACE=space)
    length, length_from = _context_length(ctx, shape)
    est = kvcache.estimate(shape, kvcache.Layout(), weights_total=0, budget=budget, max_model_len=length,
                           args=ctx.extra_args, allowance=0)
    evidence = {**est.as_evidence(), "budget_from": "VLLM_CPU_KVCACHE_SPACE", "attention": shape.attention,
                "max_model_len_from": length_from}
    summary = (f"KV {est.kv_per_token / 1024:g} KiB/token ({shape.attention}, {est.kv_dtype}); "
               f"VLLM_CPU_KVCACHE_SPACE {space} GiB holds {est.context_tokens:,} tokens, "
               f"{est.concurrent_sequences:.1f} sequences of {length}")
    if not est.fits:
        return fail(summary, "raise VLLM_CPU_KVCACHE_SPACE or lower max_model_len", **evidence)
    return ok(summary, **evidence)


@rule("memory.unified_headroom", BLOCKER)
def memory_unified_headroom(ctx: Context) -> Finding | None:
    """On unified memory vLLM's share is of the whole RAM; it must leave the host room (UMA page cache
    competes with CUDA; 0.85-0.87 is the field's advice, facts section 5)."""
    if ctx.profile.gpu is None or not ctx.profile.gpu.unified_memory:
        return None
    if ctx.facts.memory is None:
        return unknown("memory", ctx, "meminfo")
    utilization = float(ctx.settings.gpu_memory_utilization)
    memory = ctx.facts.memory
    wanted = memory.total * utilization
    room = memory.available - OS_HEADROOM_BYTES
    evidence = {"mem_total_gib": round(memory.total / 2**30, 1),
                "mem_available_gib": round(memory.available / 2**30, 1),
                "gpu_memory_utilization": utilization,
                "nvidia_smi_memory": [gpu.memory_total_mib for gpu in ctx.facts.gpus or ()]}
    if wanted <= room:
        return ok(f"{utilization} of {evidence['mem_total_gib']} GiB leaves the host its headroom", **evidence)
    cap = max(0.05, int(room / memory.total * 100) / 100)
    return fail(f"gpu_memory_utilization {utilization} asks for {wanted / 2**30:.1f} GiB but only "
                f"{room / 2**30:.1f} GiB are available beside the host's {OS_HEADROOM_BYTES // 2**30} GiB",
                f"--set gpu_memory_utilization={cap}", **evidence)


# ---------------------------------------------------------------------------------------------
# Disk and host


@rule("disk.space", BLOCKER)
def disk_space(ctx: Context) -> Finding:
    """Room for the venv and the weights on the paths the inventory names (together where they share a
    filesystem)."""
    needs: dict[str, float] = {ctx.settings.venv_dir: ctx.profile.venv_gib * 2**30}
    if ctx.weights_to_fetch is not None:
        needs[ctx.settings.model_dir] = ctx.weights_to_fetch * 1.05
    else:
        estimate = estimate_weights_bytes(ctx.settings.model)
        if estimate:
            needs[ctx.settings.model_dir] = estimate[0] * 1.05
    per_filesystem: dict[str, list[Any]] = {}
    for path, need in needs.items():
        disk = ctx.facts.disk_for(path)
        if disk is None:
            return unknown(f"free space at {path}", ctx, "disks")
        entry = per_filesystem.setdefault(f"{disk.checked}:{disk.total_bytes}", [disk, 0.0, []])
        entry[1] += need
        entry[2].append(path)
    evidence = {", ".join(paths): {"need_gib": round(need / 2**30, 3), "free_gib": round(disk.free_bytes / 2**30, 3),
                                   "on": disk.checked}
                for disk, need, paths in per_filesystem.values()}
    short = [paths for disk, need, paths in per_filesystem.values() if disk.free_bytes < need]
    if short:
        return fail(f"not enough free disk for {', '.join(p for paths in short for p in paths)}",
                    "free space there or point venv_dir/model_dir at a larger filesystem", **evidence)
    return ok("enough free disk", **evidence)


@rule("config.model", BLOCKER)
def config_model(ctx: Context) -> Finding | None:
    """A serving host names the model it serves (`model`, in its vars, its group's or its cluster's):
    without one the unit's command line has no model (`--model .../current` of nothing), and a
    systemd host would be given a unit that can never start. A host that only runs an endpoint's
    router serves no model of its own."""
    if ctx.settings.model:
        return ok(f"serves {ctx.settings.model}", model=ctx.settings.model)
    if ctx.endpoints:
        return None
    return fail("no model to serve: the inventory names none for this host", _model_fix(ctx), model=None)


def _model_fix(ctx: Context) -> str:
    """Where the missing model is written: the host's own inventory file, or (`--host local` without
    one) the command line, or a starter inventory that `init` writes."""
    line = "`vars: {model: ORG/NAME}`"
    if ctx.source in (None, "built-in"):
        return (f"`--set model=ORG/NAME`, or `{hints.command(f'init --host {ctx.host}')}` writes an inventory "
                f"where {line} goes under the host")
    return f"add {line} under host {ctx.host} in {ctx.source} (or its cluster's vars), or `--set model=ORG/NAME`"


@rule("model.hub", BLOCKER)
def model_hub(ctx: Context) -> Finding | None:
    """The model the inventory names exists on the hub (or mirror) at its revision and may be read
    with the secrets at hand; its revision resolves to one commit, which the plan then names. Where
    the hub gave no answer (DNS, a refused connection, a proxy's error), the fix names the network, the
    proxy and hf_endpoint, not the model or the token."""
    if ctx.snapshot is None and ctx.snapshot_error is None:
        return None
    if ctx.snapshot_error and ctx.hub_unreachable:  # no answer: nothing is known of the model or token
        return fail(ctx.snapshot_error, unreachable_fix(ctx.settings.hf_endpoint),
                    model=ctx.settings.model, revision=ctx.settings.model_revision, endpoint=ctx.settings.hf_endpoint)
    if ctx.snapshot_error:
        return fail(ctx.snapshot_error, "fix model / model_revision in the inventory, or hf_token in its "
                    "secrets file", model=ctx.settings.model, revision=ctx.settings.model_revision)
    snap = ctx.snapshot
    return ok(f"{snap.repo}@{snap.revision} is commit {snap.commit[:12]}: {len(snap.files)} file(s), "
              f"{snap.total_bytes / 2**20:.1f} MiB", commit=snap.commit, files=len(snap.files),
              bytes=snap.total_bytes, endpoint=ctx.settings.hf_endpoint)


def _listen_address(ctx: Context, engine: Engine) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """Where the rendered server command really listens: its last host flag (the server takes the
    last one), not only bind_host, so that no flag the inventory slips in beside it goes unjudged."""
    command = engine.server_command(ctx, str(ctx.settings.model or "MODEL"), ())
    try:
        return ipaddress.ip_address(engine.listen_address(command) or "")
    except ValueError:
        return None


@rule("config.api_key", BLOCKER)
def api_key(ctx: Context) -> Finding | None:
    """A server listening beyond loopback answers anyone who reaches it: it needs an API key (vLLM
    reads VLLM_API_KEY from the 0600 environment file)."""
    if ctx.cluster and ctx.cluster.multi_node and ctx.host != ctx.cluster.head:
        return None  # workers serve no API
    engine = engine_of(ctx.settings)
    address = _listen_address(ctx, engine)
    if address is not None and address.is_loopback:
        return ok(f"listens on {address} (loopback) only", bind_host=str(address))
    if address is None:  # a host name, or no address at all: judged as reachable
        return fail("the server's command line names no IP address to listen on", "set bind_host (and no "
                    "--host in server_flags or extra_args)", bind_host=str(ctx.settings.bind_host))
    if engine.api_key_variable is None:
        keyed = [entry.name for entry in catalog.ENGINES.values() if entry.api_key_variable]
        why = engine.entry.keyless or f"{engine.title}'s server checks no API key"
        return fail(f"the server would listen on {address}, and {why}",
                    "keep bind_host 127.0.0.1 and put an authenticating proxy in front of it (an endpoint: its "
                    f"router checks the API key), or serve with engine: {' or '.join(keyed)} ({engine.source})",
                    bind_host=str(address), engine=engine.name)
    if ctx.api_key_set:
        return ok(f"listens on {address}, with an API key ({engine.api_key_variable})", bind_host=str(address))
    return fail(f"the server would listen on {address} without an API key",
                "put api_key in the inventory's secrets file (the tool hands it to the engine as "
                f"{engine.api_key_variable}), or keep bind_host 127.0.0.1", bind_host=str(address))


# ---------------------------------------------------------------------------------------------
# Endpoints (provision/endpoints.py): the router on this host and the replicas it sends to

# The oldest HAProxy the rendered config was checked with (`haproxy -c`, and run by the tests: Debian
# 12's 2.6.12); it routes by the request's model with json_query, reads bodies whole with
# wait-for-body (2.4) and retries dropped requests with retry-on.
ROUTER_MINIMUM = (2, 6)


@rule("endpoint.router", BLOCKER)
def endpoint_router(ctx: Context) -> Finding | None:
    """A host that runs an endpoint's router has HAProxy, new enough for the config the tool renders
    (`invoke prepare` installs it where the profile's OS has a package for it)."""
    if not ctx.endpoints:
        return None
    names = ", ".join(plan.name for plan in ctx.endpoints)
    version = ctx.facts.router_version
    if version is None:
        return fail(f"endpoint {names} runs its router here, and HAProxy is not installed "
                    f"({ctx.facts.notes.get('router', 'haproxy -v answered nothing')})",
                    f"`{hints.command(f'prepare --host {ctx.host}')}` installs it (apt-get install haproxy)", endpoints=names)
    if version_tuple(version) < ROUTER_MINIMUM:
        low = ".".join(map(str, ROUTER_MINIMUM))
        return fail(f"HAProxy {version} is older than {low}, the oldest the router's config is checked with",
                    f"install HAProxy {low} or newer (haproxy.debian.net has packages for older releases)",
                    router=version)
    return ok(f"HAProxy {version} for endpoint {names}", router=version)


@rule("endpoint.replicas", BLOCKER)
def endpoint_replicas(ctx: Context) -> Finding | None:
    """Every replica an endpoint's router sends to is reachable from this host (a server on another host
    must listen beyond loopback), its model name is one HAProxy can route by, and the router's port is
    not the port this host's own server listens on."""
    if not ctx.endpoints:
        return None
    problems = []
    for plan in ctx.endpoints:
        for replica in plan.replicas:
            if replica.unreachable:
                problems.append(f"{plan.name}: cluster {replica.cluster} on {replica.host}: {replica.unreachable}")
            if not endpoints.MODEL_NAME.match(replica.model):
                problems.append(f"{plan.name}: cluster {replica.cluster} serves the model as {replica.model!r}: "
                                "set served_model_name to letters, digits and ._:/@+- only")
        if ctx.is_head and ctx.settings.model and plan.port == int(ctx.settings.port):
            problems.append(f"{plan.name}: port {plan.port} is this host's server's port too")
    if problems:
        return fail("; ".join(problems), "change the inventory: bind_host, served_model_name or the "
                    "endpoint's port", problems=problems)
    count = sum(len(plan.replicas) for plan in ctx.endpoints)
    return ok(f"{count} replica(s) behind {', '.join(plan.name for plan in ctx.endpoints)}",
              replicas={plan.name: [f"{r.cluster} {r.address}:{r.port} ({r.model})" for r in plan.replicas]
                        for plan in ctx.endpoints})


# The oldest Prometheus the rendered configuration is checked with (`promtool check config`, and run by
# the lab's tests): Debian 12's 2.42.0 (Ubuntu 24.04 packages 2.45). It reads the key with
# authorization.credentials_file and the targets with file_sd_configs.
PROMETHEUS_MINIMUM = (2, 42)


@rule("metrics.prometheus", BLOCKER)
def metrics_prometheus(ctx: Context) -> Finding | None:
    """The host the inventory's `prometheus:` names (with manage: true) has Prometheus, new enough for
    the configuration the tool renders (`invoke prepare` installs the distribution's package)."""
    if ctx.prometheus is None or not ctx.prometheus.manage:
        return None
    version = ctx.facts.prometheus_version
    if version is None:
        return fail(f"the inventory's Prometheus runs here, and Prometheus is not installed "
                    f"({ctx.facts.notes.get('prometheus', 'prometheus --version answered nothing')})",
                    f"`{hints.command(f'prepare --host {ctx.host}')}` installs it (apt-get install prometheus)")
    if version_tuple(version) < PROMETHEUS_MINIMUM:
        low = ".".join(map(str, PROMETHEUS_MINIMUM))
        return fail(f"Prometheus {version} is older than {low}, the oldest its configuration is checked with",
                    f"install Prometheus {low} or newer", prometheus=version)
    return ok(f"Prometheus {version}", prometheus=version)


@rule("endpoint.api_key", BLOCKER)
def endpoint_api_key(ctx: Context) -> Finding | None:
    """An endpoint that listens beyond loopback checks an API key in front of its replicas (the same
    api_key the replicas check)."""
    beyond = [plan for plan in ctx.endpoints if plan.listens_beyond_loopback]
    if not beyond:
        return None if not ctx.endpoints else ok("the router listens on loopback only")
    names = ", ".join(f"{plan.name} ({plan.bind_host}:{plan.port})" for plan in beyond)
    if ctx.api_key_set:
        return ok(f"{names}: requests without the API key get 401 at the router")
    return fail(f"endpoint {names} would listen without an API key",
                "put api_key in the inventory's secrets file, or bind the endpoint to 127.0.0.1")


# ---------------------------------------------------------------------------------------------
# The engine (provision/engines): what it runs on, how it spans nodes, the weights' format


def _from_verdict(verdict: Verdict | None) -> Finding | None:
    if verdict is None:
        return None
    evidence = dict(verdict.evidence)
    if verdict.status == "pass":
        return ok(verdict.message, **evidence)
    if verdict.status == "warn":
        return warn(verdict.message, verdict.fix, **evidence)
    return fail(verdict.message, verdict.fix, **evidence)


@rule("engine.support", BLOCKER)
def engine_support(ctx: Context) -> Finding | None:
    """The engine runs this GPU and this checkpoint's quantization (TensorRT-LLM's support matrix;
    llama.cpp loads GGUF only, built for extensions the CPU has). Sources: each engine module's docstring."""
    return _from_verdict(engine_of(ctx.settings).support(ctx))


@rule("engine.nodes", BLOCKER)
def engine_nodes(ctx: Context) -> Finding | None:
    """The engine can spread the model over this cluster's nodes (vLLM by its own launch or over Ray,
    TensorRT-LLM over MPI, llama.cpp on one host), with what its launch needs (vLLM's own: the release and
    the same vLLM and torch on every node; Ray: Ray in the venv; TensorRT-LLM: the MPI key, the host keys)."""
    return _from_verdict(engine_of(ctx.settings).nodes(ctx))


def install_gaps(ctx: Context) -> tuple[str | None, tuple[index_gaps.Gap, ...]]:
    """The engine release engine_spec pins exactly, and the gaps (index_gaps.yaml) that keep pip from
    installing it from the host's indexes; (None, ()) where nothing is pinned."""
    engine = ctx.settings.engine
    pinned = venv.pinned_version(venv.requirements_of(ctx.settings), engine)
    if pinned is None:
        return None, ()
    indexes = venv.indexes_of(ctx.settings)
    return pinned, index_gaps.gaps(engine, pinned, [u for u in (indexes.index_url, *indexes.extra_index_urls) if u])


@rule("engine.installable", BLOCKER)
def engine_installable(ctx: Context) -> Finding | None:
    """pip can install the engine release engine_spec names from the host's indexes: a release whose
    wheel pins a requirement PyPI never carried (index_gaps.yaml, each row with its source: vLLM 0.34.0
    pins flashinfer-python==0.7.3) is refused before anything changes, with the index that carries it and
    the release before it. An engine_spec without an exact pin leaves such releases out (the finding says
    which release that resolves to)."""
    requirements = venv.requirements_of(ctx.settings)
    if not requirements:
        return None
    engine = engine_of(ctx.settings)
    pinned, gaps = install_gaps(ctx)
    if gaps:
        gap = gaps[0]
        return fail(f"{engine.title} {pinned} cannot be installed from these indexes: it pins {gap.requires}, "
                    f"which PyPI does not carry ({gap.pypi})",
                    f"add {gap.index} to pip_extra_index_urls, or pin {ctx.settings.engine}=={gap.instead} "
                    f"in engine_spec (see {gap.source})",
                    release=pinned, requires=gap.requires, index=gap.index, instead=gap.instead, source=gap.source)
    if pinned is not None:
        return ok(f"{engine.title} {pinned}: no pin of it is missing from the indexes "
                  "(index_gaps.yaml)", release=pinned)
    planned = engine.service_requirements(ctx)
    narrowed = [req for req in planned if req not in requirements and "!=" in req]
    if not narrowed:
        return ok(f"{' '.join(requirements)}: no release of it is known missing from the indexes", release=None)
    resolved = next((version for key, version in known_issues.wheel_versions(ctx.resolved_wheels or ()).items()
                     if key == ctx.settings.engine), None)
    left = [gap for gap in index_gaps.load() if gap.engine == ctx.settings.engine]
    return Finding("", INFO, PASS,
                   f"{' '.join(requirements)} resolves as {' '.join(narrowed)}: "
                   + "; ".join(f"{', '.join(gap.releases())} pins {gap.requires}, which PyPI does not carry"
                               for gap in left)
                   + (f"; it installs {engine.title} {resolved}" if resolved else
                      f"; the newest release before it that PyPI installs is {left[0].instead}"),
                   {"requirements": narrowed, "release": resolved or left[0].instead, "source": left[0].source})


@rule("engine.model", BLOCKER)
def engine_model(ctx: Context) -> Finding | None:
    """The weights are in the engine's format: one GGUF file for llama.cpp, a Hugging Face checkpoint
    (config.json and safetensors) for vLLM and TensorRT-LLM. Read from the hub's file list."""
    if ctx.snapshot is None:
        return None
    engine = engine_of(ctx.settings)
    names = [f.path for f in ctx.snapshot.files]
    ggufs = [name for name in names if name.endswith(".gguf")]
    if engine.model_format == "gguf":
        firsts = gguf_models(names)
        if len(firsts) == 1:
            return ok(f"{engine.title} loads {firsts[0]}", file=firsts[0])
        return fail(f"{engine.title} serves one GGUF file; {ctx.snapshot.repo} offers {len(firsts)}",
                    "name a GGUF repository and narrow model_files to one file (e.g. ['*Q4_K_M.gguf'])",
                    files=firsts[:6])
    if "config.json" in names:
        return ok(f"{ctx.snapshot.repo} is a Hugging Face checkpoint", engine=engine.name)
    if ggufs:
        return fail(f"{ctx.snapshot.repo} holds GGUF files, which {engine.title} does not serve",
                    "serve it with engine: llamacpp, or name the model's Hugging Face checkpoint", files=ggufs[:6])
    return fail(f"{ctx.snapshot.repo} has no config.json: {engine.title} cannot load it",
                "name a Hugging Face checkpoint (or add config.json to model_files)", engine=engine.name)


@rule("engine.version", WARNING, engines=("trtllm",))
def engine_version(ctx: Context) -> Finding | None:
    """The unit is rendered for one TensorRT-LLM release (engine_spec's tensorrt_llm pin, else the contract
    table's target, provision/engine_contracts.yaml): the venv's installed release (its tensorrt_llm
    dist-info) should be that one, or a flag may be one it lacks or misses one it has. A setting the
    release has no option for (served_model_name before 1.3.0rc7) is said, not silently dropped."""
    release = TRTLLM.release(ctx.settings)
    venv = ctx.facts.venv
    installed = (venv.packages or {}).get("tensorrt_llm") if venv else None
    problems, fixes = [], []
    if installed and not _same_release(installed, release):
        problems.append(f"the venv has TensorRT-LLM {installed}; the unit is rendered for {release}")
        fixes.append(f"pin engine_spec: tensorrt_llm=={installed} (the tool renders for the pin), or install {release}")
    if ctx.settings.served_model_name and TRTLLM.served_name_flag(ctx.settings) is None:
        problems.append(f"TensorRT-LLM {release} has no served-name option (--served_model_name came with 1.3.0rc7): clients see the model by "
                        f"the directory it loads, not as {ctx.settings.served_model_name!r}")
        fixes.append("leave served_model_name out, or serve 1.3.0rc7 or later")
    evidence = {"release": release, "installed": installed}
    if problems:
        return warn("; ".join(problems), "; ".join(fixes), **evidence)
    if installed:
        return ok(f"the venv has TensorRT-LLM {installed}, the release the unit is rendered for", **evidence)
    return ok(f"rendered for TensorRT-LLM {release} (the venv's release is read once it exists)", **evidence)


def _same_release(installed: str, release: str) -> bool:
    try:
        return Version(installed) == Version(release)
    except InvalidVersion:
        return installed == release


@rule("host.systemd", BLOCKER)
def host_systemd(ctx: Context) -> Finding:
    """The service is a systemd unit: systemd must be PID 1."""
    if ctx.facts.init is None:
        return unknown("PID 1", ctx, "init")
    if ctx.facts.systemd_is_pid1:
        return ok("systemd is PID 1", init=ctx.facts.init)
    return fail(f"PID 1 is {ctx.facts.init}, not systemd", "run on a host booted with systemd",
                init=ctx.facts.init)


@rule("venv.base", BLOCKER)
def venv_base(ctx: Context) -> Finding | None:
    """A venv made over a base environment (venv_base: a vendor's CUDA torch image) needs it there, with
    pip, which installs what the base lacks; torch, its companions and their CUDA libraries stay the
    base's (the wheels are resolved around them: a release the engine refuses stops the plan)."""
    path = ctx.settings.venv_base
    if not path:
        return None
    base = ctx.facts.venv_base
    if base is None:
        return fail(f"venv_base {path}: no Python environment there "
                    f"({ctx.facts.notes.get('venv_base', 'not read')})",
                    f"name a directory holding bin/python (ls {path}/bin/python), or remove venv_base",
                    venv_base=path)
    kept = venv.kept_from_base(base.dists)
    evidence = {"venv_base": path, "python": base.python, "site": list(base.site), "distributions": len(base.dists),
                "kept": {name: base.dists[name][0] for name in kept}}
    if "pip" not in base.dists:
        return fail(f"venv_base {path} has no pip: the venv's packages are installed with the base's pip",
                    f"{path}/bin/python -m ensurepip", **evidence)
    torch = base.version_of("torch")
    held = f"torch {torch} and {len(kept) - 1} more kept as the base's" if torch else "no torch"
    return ok(f"the venv reuses {path} (Python {base.python}, {len(base.dists)} distributions): {held}", **evidence)


def planned_releases(ctx: Context) -> dict[str, str]:
    """{distribution: release} of what the next apply installs into the service venv: the planned
    wheels (pip resolved them), else the exact pins of engine_spec ('vllm==0.34.0')."""
    if ctx.resolved_wheels is not None:
        return {canonicalize_name(name.split("-")[0]): name.split("-")[1]
                for name in ctx.resolved_wheels if name.count("-") >= 2}
    pins: dict[str, str] = {}
    for requirement in venv.requirements_of(ctx.settings):
        try:
            parsed = Requirement(requirement)
        except InvalidRequirement:
            continue
        exact = [spec.version for spec in parsed.specifier if spec.operator in ("==", "===") and "*" not in spec.version]
        if exact:
            pins[canonicalize_name(parsed.name)] = exact[0]
    return pins


def python_refusals(ctx: Context) -> tuple[tuple[str, str, python_floors.Floor], ...]:
    """The releases about to be installed that the Python making the venv cannot install
    (python_floors.yaml): vllm==0.34.0 on Ubuntu 22.04's 3.10, sglang==0.5.23 on 3.14."""
    base = ctx.facts.venv_base if ctx.settings.venv_base else None
    version = base.python if base else ctx.facts.python
    return python_floors.refusals(planned_releases(ctx), version) if version else ()


@rule("host.python", BLOCKER)
def host_python(ctx: Context) -> Finding:
    """python3 makes the venv (the base environment's python where venv_base names one). A release the
    next apply installs (the planned wheels, else engine_spec's exact pins) must install on it: its
    Requires-Python and the wheels it ships (python_floors.yaml, each row with its source: vLLM 0.32+,
    SGLang 0.5.22+, torch 2.15 and Triton 3.9 need Python 3.11; SGLang 0.5.23 has wheels for 3.11 to 3.13
    only); refused before pip is asked. Otherwise vLLM publishes wheels for Python 3.10-3.13."""
    base = ctx.facts.venv_base if ctx.settings.venv_base else None
    version = base.python if base else ctx.facts.python
    if version is None:
        return unknown("python3 version", ctx, "python")
    found = version_tuple(version)[:2]
    refused = python_refusals(ctx)
    if refused:
        return fail(f"python3 {version} cannot install what the venv is made of: "
                    + "; ".join(f"{package} {release} needs Python {floor.python} ({floor.says})"
                                for package, release, floor in refused),
                    "install python3.12 (apt-get install python3.12 python3.12-venv) for the venv, or pin "
                    + ", ".join(f"a {package} release that installs on {version}" for package, _, _ in refused)
                    + f" in engine_spec (see {refused[0][2].source})",
                    python=version, releases={package: release for package, release, _ in refused},
                    source=[floor.source for _, _, floor in refused])
    low, high = VLLM_PYTHON
    if found < low:
        return fail(f"python3 {version} is older than {low[0]}.{low[1]}",
                    "install python3.12 (apt-get install python3.12 python3.12-venv)", python=version)
    if found > high:
        return warn(f"python3 {version} is newer than vLLM's wheels ({high[0]}.{high[1]})",
                    "install python3.12 beside it for the venv", python=version)
    return ok(f"python3 {version}", python=version)


@rule("host.service_user", WARNING)
def host_service_user(ctx: Context) -> Finding:
    """The server runs as its own unprivileged user, created by provision."""
    user = ctx.settings.service_user
    if user == "root":
        return fail("the server would run as root", "--set service_user=vllm", service_user=user)
    return ok(f"runs as {user}", service_user=user)


@rule("unit.security", WARNING)
def unit_security(ctx: Context) -> Finding | None:
    """systemd's own score of each installed unit (`systemd-analyze security --offline=yes UNIT`, drop-ins
    included) against the target of the host's hardening level (provision/hardening.py): info with the
    score, a warning above it (an operator's drop-in that loosens the sandbox, say). The strict level's
    device allow-list and system-call filter are not proven on a GPU, and the finding says so."""
    level = str(ctx.settings.hardening)
    target = hardening.EXPOSURE_TARGETS[level]
    scored = ctx.facts.unit_security or {}
    installed = sorted({name for name, state in (ctx.facts.units or {}).items()  # a service's units among them
                        if (name in MANAGED_UNITS or "@" in name) and state.load_state == "loaded"} | set(scored))
    note = ctx.facts.notes.get("unit_security", "")
    if not installed or (ctx.facts.unit_security is None and "not present" in note):
        return None  # nothing installed yet, or no systemd-analyze to ask
    evidence: dict[str, Any] = {
        "units": {name: {"exposure": scored[name].exposure, "level": scored[name].level}
                  for name in installed if name in scored},
        "target": target, "hardening": level}
    unproven = level == "strict" and bool(ctx.profile.devices)
    caveat = ("; strict's device allow-list and system-call filter are not proven on a GPU"
              if unproven else "")
    missing = [name for name in installed if name not in scored]
    if missing:
        return warn(f"{', '.join(missing)} could not be scored ({note or 'no score printed'}){caveat}",
                    "systemd-analyze 250 or newer scores unit files offline (package systemd)",
                    unscored=missing, **evidence)
    above = [name for name in installed if scored[name].exposure > target]
    scores = ", ".join(f"{name} {scored[name].exposure} {scored[name].level}" for name in installed)
    if above:
        return warn(f"exposure above {target} (hardening {level}): {scores}{caveat}",
                    f"`systemctl cat {above[0]}` shows what loosens it (a drop-in?); remove that, or "
                    f"run `{hints.command('provision')}` to put the rendered unit back", above=above, **evidence)
    return Finding("", INFO, PASS, f"exposure {scores} (target {target}, hardening {level}){caveat}",
                   evidence)


@rule("unit.devices", BLOCKER)
def unit_devices(ctx: Context) -> Finding | None:
    """`hardening: strict` closes every device but an allow-list: the profile's `devices` entries
    matched against the character device groups the host's drivers registered in /proc/devices
    (provision/hardening.py; systemd resolves DeviceAllow=char-NAME the same way when the unit starts).
    A list that holds none of the groups on the NVIDIA driver's major, 195 (the GPUs and
    /dev/nvidiactl: `nvidia` and `nvidiactl` since driver 545, read so on an H200 with 580; facts
    section 10), would shut the server out of the GPU where the device controller is enforced: refused.
    An entry that matches no group (nvidia-uvm not loaded yet, say) is left out of the unit: a warning.
    Where /proc/devices was not read, the entries are rendered as written, and the finding says so.
    The default level keeps the host's /dev: nothing to judge."""
    if str(ctx.settings.hardening) != "strict" or not ctx.profile.devices:
        return None
    entries = hardening.device_entries(ctx)
    written = ", ".join(item.entry for item in entries)
    host = ctx.facts.device_groups
    if host is None:
        note = ctx.facts.notes.get("proc_devices", "no value")
        return warn(f"could not be checked: the host's device groups are unknown ({note}); the unit allows "
                    f"the profile's entries as written, unchecked against its driver: {written}",
                    f"make /proc/devices readable (see `{hints.command(f'facts --host {ctx.host}')}`)",
                    entries=[item.entry for item in entries], proc_devices=None)
    matched = {item.entry: [f"{group.major} {group.name}" for group in item.groups]
               for item in entries if item.groups}
    unmatched = [item for item in entries if item.groups == ()]
    nvidia = [f"{group.major} {group.name}" for group in host if group.major == hardening.NVIDIA_MAJOR]
    evidence = {"matched": matched, "unmatched": [item.entry for item in unmatched], "nvidia_groups": nvidia}
    if not any(group.major == hardening.NVIDIA_MAJOR for item in entries for group in item.groups or ()):
        if nvidia:
            return fail(f"strict's device allow-list ({written}) matches none of the NVIDIA driver's groups "
                        f"on major {hardening.NVIDIA_MAJOR} ({', '.join(nvidia)}): the server would be shut "
                        "out of the GPUs",
                        "name the driver's groups in the profile's devices (char-NAME rw: what it covers), or "
                        "--set hardening=default", **evidence)
        return fail(f"strict's device allow-list would reach no GPU: the host's /proc/devices has no group on "
                    f"major {hardening.NVIDIA_MAJOR}, the NVIDIA driver's: no driver registered its devices there (a "
                    "container reads its machine's /proc/devices)",
                    "load the NVIDIA driver (it registers 195 nvidia and nvidiactl), or --set hardening=default",
                    **evidence)
    allowed = ", ".join(dict.fromkeys(f"char-{group.name} ({group.major})" for item in entries
                                      for group in item.groups or ()))
    if unmatched:
        left = ", ".join(f"{item.entry} ({item.reason})" for item in unmatched)
        return warn(f"DeviceAllow= {allowed}; left out, no such group in /proc/devices: {left}",
                    "load the module that registers it before the unit starts (nvidia-uvm: a modules-load.d "
                    f"entry), then render again (`{hints.command('provision')}`)", **evidence)
    return ok(f"DeviceAllow= {allowed}: the groups the host's drivers registered", **evidence)


@rule("cpu.affinity", BLOCKER)
def cpu_affinity(ctx: Context) -> Finding | None:
    """The server's CPUAffinity comes from the topology facts (provision/affinity.py). Where one of them
    answered but could not be read, `auto` cannot be chosen: the gate blocks ("could not be checked")
    instead of rendering the unit unpinned, which the next apply would restart the server as."""
    if ctx.cluster and ctx.cluster.multi_node and ctx.host != ctx.cluster.head:
        return None  # workers run Ray, not the pinned server
    policy = str(ctx.settings.cpu_affinity)
    if policy == "all":
        return None
    unread = sorted(set(affinity.SOURCES) & ctx.facts.unreadable)
    if unread:
        notes = "; ".join(ctx.facts.notes.get(name, name) for name in unread)
        return fail(f"could not be checked: the CPU topology that cpu_affinity {policy} is chosen from did "
                    f"not read ({notes})", f"make {', '.join(unread)} readable on the host (see "
                    f"`{hints.command(f'facts --host {ctx.host}')}`), or --set cpu_affinity=all to run unpinned on purpose",
                    cpu_affinity=policy, unreadable=unread)
    gpus = ctx.server_gpus
    try:
        chosen = affinity.choose(policy, ctx.facts.cpu, gpus=gpus)
    except AffinityError as exc:
        return fail(str(exc), "choose a cpu_affinity this host has (auto, all, ccd:N or a CPU list)",
                    cpu_affinity=policy)
    message = f"cpu_affinity {policy}: {chosen.cpu_list or 'no pinning'} ({chosen.reason})"
    evidence = {"cpu_affinity": policy, "cpus": chosen.cpu_list,
                "numa_mask": list(chosen.numa_nodes) if chosen.numa_nodes else None,
                "gpu_numa_nodes": {gpu.index: gpu.node for gpu in gpus}}
    concerns = affinity.placement_concerns(ctx.facts.cpu, gpus, chosen)
    if concerns:
        return warn(f"{message}; " + "; ".join(what for what, _ in concerns),
                    "; ".join(dict.fromkeys(fix for _, fix in concerns)), **evidence)
    return ok(message, **evidence)


@rule("unit.dropins", BLOCKER)
def unit_dropins(ctx: Context) -> Finding | None:
    """A drop-in (`systemctl edit`, `systemctl set-property`: a *.conf in a unit's .d directory,
    systemd.unit(5)) overrides the unit the tool renders: the plan would call the unit "as rendered"
    while systemd runs something else, and the next daemon-reload brings an unloaded one into force.
    Provision refuses rather than deleting it: it is an operator's change, often a deliberate fix,
    which belongs in the inventory (environment, extra_args, cpu_affinity) where the plan sees it."""
    listed = {path: names for path, names in ctx.facts.dirs.items()  # a service's units' drop-ins too
              if path in DROP_IN_DIRS or (path.endswith(".service.d") and "@" in path)}
    if not listed:
        return None  # not inspected (facts without a plan's inspection)
    found = [f"{path}/{name}" for path, names in listed.items() for name in names or ()
             if name.endswith(".conf")]  # systemd reads only *.conf there
    if found:
        units = sorted({path.rsplit("/", 2)[1][:-2] for path in found})
        return fail(f"drift: drop-in {', '.join(found)} overrides {', '.join(units)}",
                    "move what it sets into the inventory (environment, extra_args, cpu_affinity), then "
                    f"`rm {' '.join(found)}` and `systemctl daemon-reload`; or --force unit.dropins to keep it",
                    drop_ins=found)
    return ok("no drop-in overrides the tool's units", checked=sorted(listed))


# ---------------------------------------------------------------------------------------------
# Several services on one host (provision/services.py): judged together, each from its own side


def _gpu_indices(ctx: Context, settings: Settings) -> set[int]:
    """The host GPUs a service of these settings runs on (its CUDA_VISIBLE_DEVICES; none set: all)."""
    selection = settings.environment.get("CUDA_VISIBLE_DEVICES")
    return {gpu.index for gpu in visible(ctx.facts.gpus or (), None if selection is None else str(selection))}


@rule("services.gpus", BLOCKER)
def services_gpus(ctx: Context) -> Finding | None:
    """A service's `gpus` are GPUs the host has (CUDA would silently hide the rest, and the server would
    land on fewer GPUs than its tensor parallel size, or on none)."""
    selection = ctx.env("CUDA_VISIBLE_DEVICES")
    if ctx.naming.service is None or ctx.profile.gpu is None or selection is None:
        return None
    if ctx.facts.gpus is None:
        return unknown("GPUs", ctx, "gpus")
    asked = [part.strip() for part in selection.split(",")]
    seen = ctx.visible_gpus
    if len(seen) < len(asked):
        missing = asked[len(seen)]
        return fail(f"GPU {missing} is not on this host ({len(ctx.facts.gpus)} GPU(s): "
                    f"{', '.join(str(gpu.index) for gpu in ctx.facts.gpus) or 'none'})",
                    f"name GPUs from `{hints.command('facts --host HOST')}` in the service's gpus", gpus=asked)
    return ok(f"GPU(s) {', '.join(str(gpu.index) for gpu in seen)}", gpus=[gpu.index for gpu in seen])


@rule("services.ports", BLOCKER)
def services_ports(ctx: Context) -> Finding | None:
    """Each service of a host listens on a port of its own: two servers cannot bind one port (the
    second would crash-loop at start)."""
    if not ctx.siblings:
        return None
    port = int(ctx.settings.port)
    taken = sorted(name for name, settings in ctx.siblings.items() if int(settings.port) == port)
    if taken:
        return fail(f"port {port} is also {', '.join(taken)}'s", "give each service its own port in its vars",
                    port=port, also=taken)
    return ok(f"port {port} is this service's alone", port=port,
              others={name: int(settings.port) for name, settings in ctx.siblings.items()})


@rule("services.shared_gpu", BLOCKER)
def services_shared_gpu(ctx: Context) -> Finding | None:
    """Services that share a GPU each declare their share of its memory (gpu_memory_utilization in the
    service's vars), and the shares of every service on that GPU sum to at most the profile's own
    (what it gives one server alone): each engine takes its share of the whole GPU at start, so two
    undeclared 0.9s leave the second server without memory. Each service's weights and KV cache
    must fit its share: memory.fits judges that with the declared share as its budget."""
    if not ctx.siblings or ctx.profile.gpu is None or not ctx.facts.gpus:
        return None
    mine = _gpu_indices(ctx, ctx.settings)
    sharing = {name: settings for name, settings in ctx.siblings.items() if _gpu_indices(ctx, settings) & mine}
    if not sharing:
        return ok(f"GPU(s) {', '.join(map(str, sorted(mine)))} serve this service alone")
    everyone = {ctx.host: ctx.settings, **sharing}
    undeclared = sorted(name for name, settings in everyone.items()
                        if not settings.origin.get("gpu_memory_utilization", "").startswith("service "))
    limit = float(ctx.profile.defaults.get("gpu_memory_utilization", VAR_SPECS["gpu_memory_utilization"].default))
    shares = {name: float(settings.gpu_memory_utilization) for name, settings in everyone.items()}
    evidence = {"shared_with": sorted(sharing), "gpus": sorted(mine), "shares": shares, "limit": limit}
    if undeclared:
        return fail(f"GPU(s) {', '.join(map(str, sorted(mine)))} shared with {', '.join(sorted(sharing))}, but "
                    f"{', '.join(undeclared)} declare(s) no gpu_memory_utilization of its own",
                    f"set gpu_memory_utilization in each sharing service's vars, together at most {limit}",
                    undeclared=undeclared, **evidence)
    for index in sorted(mine):
        on_gpu = {name: share for name, share in shares.items()
                  if index in _gpu_indices(ctx, everyone[name])}
        total = round(sum(on_gpu.values()), 4)
        if total > limit:
            listed = " + ".join(f"{name} {share}" for name, share in on_gpu.items())
            return fail(f"GPU {index}: {listed} = {total} of its memory, more than the profile's {limit}",
                        f"lower the services' gpu_memory_utilization to sum to {limit} or less", gpu=index,
                        **evidence)
    return ok(f"GPU(s) {', '.join(map(str, sorted(mine)))} shared with {', '.join(sorted(sharing))}: "
              f"shares {', '.join(f'{name} {share}' for name, share in shares.items())}, within {limit}", **evidence)


# ---------------------------------------------------------------------------------------------
# Configuration conflicts


@rule("config.custom_allreduce", WARNING, engines=("vllm",))
def config_custom_allreduce(ctx: Context) -> Finding | None:
    """expandable_segments:True + TP > 1 + custom all-reduce crashes at startup
    (custom_all_reduce.cuh:455 'invalid argument'; vllm #42609, #56180 on 2x RTX 5090). Resolved by
    passing --disable-custom-all-reduce; forcing it on is warned about."""
    conf = " ".join(filter(None, (ctx.env("PYTORCH_ALLOC_CONF"), ctx.env("PYTORCH_CUDA_ALLOC_CONF"))))
    if ctx.profile.gpu is None or int(ctx.settings.tensor_parallel_size) <= 1 or \
            "expandable_segments:True" not in conf:
        return None
    evidence = {"alloc_conf": conf, "tensor_parallel_size": ctx.settings.tensor_parallel_size}
    if "--no-disable-custom-all-reduce" in ctx.extra_args:
        return fail("custom all-reduce is forced on with expandable_segments and TP > 1: a known startup "
                    "crash", "drop --no-disable-custom-all-reduce or expandable_segments:True", **evidence)
    if "--disable-custom-all-reduce" in ctx.extra_args:
        return ok("custom all-reduce already disabled", **evidence)
    return Finding("", "", PASS, "resolved: the server gets --disable-custom-all-reduce", evidence,
                   resolution={"extra_args": ["--disable-custom-all-reduce"]})


ALLOC_CONF_NAMES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


@rule("config.alloc_conf", BLOCKER)
def config_alloc_conf(ctx: Context) -> Finding | None:
    """PYTORCH_ALLOC_CONF and its older name PYTORCH_CUDA_ALLOC_CONF must say the same: torch 2.9+ reads
    the new name (the old one warns as deprecated), torch 2.9.1+cu128 ignores the new name for CUDA
    (pytorch #183387), so the setting that applies depends on the venv's torch (facts section 4). A layer
    of the inventory that sets one name sets both; two different values set on purpose block here."""
    values = {name: ctx.env(name) for name in ALLOC_CONF_NAMES}
    if not any(values.values()):
        return None
    if len(set(values.values())) == 1:
        return ok(f"both names say {values['PYTORCH_ALLOC_CONF']}", **values)
    return fail("PYTORCH_ALLOC_CONF and PYTORCH_CUDA_ALLOC_CONF disagree: which one applies depends on the "
                "torch version", "set one of them (the other follows) or give both the same value", **values)


@rule("config.quantization_awq", WARNING, engines=("vllm",))
def config_quantization_awq(ctx: Context) -> Finding | None:
    """An explicit `--quantization awq` forces the slow AWQ kernel (~5x slower) instead of the awq_marlin
    vLLM picks by itself (vllm #20112, #21376, #6985)."""
    chosen = flag_value(ctx.extra_args, "--quantization") or flag_value(ctx.extra_args, "-q")
    if chosen is None:
        return None
    if chosen == "awq":
        return fail("--quantization awq forces the slow AWQ kernel",
                    "remove --quantization awq from extra_args: vLLM picks awq_marlin itself",
                    quantization=chosen)
    return ok(f"--quantization {chosen}", quantization=chosen)


@rule("config.bitsandbytes", BLOCKER, engines=("vllm",))
def config_bitsandbytes(ctx: Context) -> Finding | None:
    """bitsandbytes quantization produces garbage output on sm_120."""
    if ctx.profile.gpu is None or ctx.profile.gpu.compute_capability != "12.0":
        return None
    chosen = flag_value(ctx.extra_args, "--quantization") or ""
    model = str(ctx.settings.model or "")
    if chosen == "bitsandbytes" or re.search(r"bnb|bitsandbytes", model, re.IGNORECASE):
        return fail("bitsandbytes on sm_120 gives garbage output", "use an AWQ or GPTQ checkpoint",
                    quantization=chosen or None, model=model)
    return ok("no bitsandbytes", model=model)


@rule("config.dmabuf", BLOCKER)
def config_dmabuf(ctx: Context) -> Finding | None:
    """NCCL_DMABUF_ENABLE=1 needs the open module and Linux >= 5.12 (nccl PR #682, pplx-garden #3);
    DGX Spark has no dma-buf at all (porting guide: DMA_BUF_SUPPORTED=0), so never force it there."""
    if ctx.env("NCCL_DMABUF_ENABLE") != "1" or ctx.profile.gpu is None:
        return None
    evidence = {"NCCL_DMABUF_ENABLE": "1", "kernel": ctx.facts.kernel,
                "flavour": ctx.facts.driver.flavour if ctx.facts.driver else None}
    fix = "--set environment='{NCCL_DMABUF_ENABLE: \"0\"}'"
    if not ctx.profile.gpu.dmabuf:
        return fail(f"{ctx.profile.name} has no dma-buf support; NCCL_DMABUF_ENABLE=1 is wrong here", fix,
                    **evidence)
    if ctx.facts.driver is not None and ctx.facts.driver.flavour != "open":
        # The variable is right for this GPU; the driver is what is wrong (driver.flavour says so too).
        branch = ctx.facts.driver.version.split(".")[0]
        return fail(f"dma-buf needs the open kernel module; this host runs the {ctx.facts.driver.flavour} "
                    f"module", f"install the open driver (nvidia-driver-{branch}-open; see driver.flavour)",
                    **evidence)
    if ctx.facts.kernel and version_tuple(ctx.facts.kernel)[:2] < DMABUF_MIN_KERNEL:
        return fail("dma-buf needs Linux 5.12 or newer", fix, **evidence)
    return ok("dma-buf usable", **evidence)


@rule("config.peermem", BLOCKER)
def config_peermem(ctx: Context) -> Finding | None:
    """No GPUDirect RDMA on DGX Spark (or GeForce): nvidia_peermem must not be loaded (porting guide)."""
    if ctx.profile.gpu is None or ctx.profile.gpu.gpudirect_rdma:
        return None
    if ctx.facts.modules is None:
        return warn(f"loaded modules unknown ({ctx.facts.notes.get('modules', 'no value')})",
                    "make /proc/modules readable", modules=None)
    if "nvidia_peermem" in ctx.facts.modules:
        return fail("nvidia_peermem is loaded on a GPU without GPUDirect RDMA",
                    "rmmod nvidia_peermem; remove it from /etc/modules-load.d", modules=["nvidia_peermem"])
    return ok("nvidia_peermem not loaded")


@rule("config.triton_ptxas", BLOCKER, engines=("vllm",))
def config_triton_ptxas(ctx: Context) -> Finding | None:
    """On sm_121 Triton < 3.6's bundled ptxas fails ("Value 'sm_121a' is not defined for option
    'gpu-name'", triton #8539): TRITON_PTXAS_PATH must point to a CUDA 13 ptxas. From Triton 3.6 arch
    >= 100 is assembled with the ptxas TRITON_PTXAS_BLACKWELL_PATH names (its bundled ptxas-blackwell
    unless set), and TRITON_PTXAS_PATH is not read there (knobs.py, triton #10331): a system ptxas
    wanted there needs that variable too. Which release reads which: the contract table (triton)."""
    if ctx.profile.cuda is None or not ctx.profile.cuda.torch_cuda_arch_list.startswith("12.1"):
        return None
    triton = triton_version(ctx)
    reads_blackwell = contracts.load().accepts("triton", "env", BLACKWELL_PTXAS, triton) if triton else None
    path, blackwell = ctx.env("TRITON_PTXAS_PATH"), ctx.env(BLACKWELL_PTXAS)
    evidence = {"triton": triton, "TRITON_PTXAS_PATH": path, BLACKWELL_PTXAS: blackwell,
                "ptxas_cuda": ctx.facts.ptxas_cuda}
    if reads_blackwell is not True:  # Triton < 3.6, or not known yet: its own ptxas may not know sm_121a
        if ctx.facts.ptxas_cuda is None or version_tuple(ctx.facts.ptxas_cuda) < (13,):
            return fail("no CUDA 13 ptxas at /usr/local/cuda/bin/ptxas",
                        "apt-get install cuda-toolkit-13-0", **evidence)
        if path != SYSTEM_PTXAS:
            return fail("TRITON_PTXAS_PATH does not point to the CUDA 13 ptxas",
                        f"environment TRITON_PTXAS_PATH={SYSTEM_PTXAS}", **evidence)
        if reads_blackwell is False:
            return ok(f"Triton {triton} uses CUDA {ctx.facts.ptxas_cuda} ptxas", **evidence)
    if path and blackwell != path:
        return warn(f"Triton {triton or '3.6+'} assembles sm_121 with {BLACKWELL_PTXAS} (its bundled "
                    f"ptxas-blackwell unless set), not TRITON_PTXAS_PATH",
                    f"environment {BLACKWELL_PTXAS}={path}", **evidence)
    # Triton 3.6+ falls back to its bundled ptxas-blackwell where the named binary cannot be run
    # (knobs.py env_nvidia_tool.transform), but runs an old one that is there, which fails on sm_121a.
    if blackwell == SYSTEM_PTXAS and ctx.facts.ptxas_cuda and version_tuple(ctx.facts.ptxas_cuda) < (13,):
        return fail(f"{BLACKWELL_PTXAS} names {SYSTEM_PTXAS}, a CUDA {ctx.facts.ptxas_cuda} ptxas that does "
                    "not know sm_121a (Triton runs it rather than its bundled ptxas-blackwell)",
                    f"apt-get install cuda-toolkit-13-0, or remove {BLACKWELL_PTXAS} from the environment",
                    **evidence)
    if blackwell == SYSTEM_PTXAS and ctx.facts.ptxas_cuda:
        used = f"{blackwell} (CUDA {ctx.facts.ptxas_cuda})"
    elif blackwell == SYSTEM_PTXAS:
        used = f"its bundled ptxas-blackwell ({blackwell} is not there, and Triton falls back)"
    elif blackwell:
        used = f"{blackwell} (not read here; Triton falls back to its bundled ptxas-blackwell if it cannot run it)"
    else:
        used = "its bundled ptxas-blackwell"
        if ctx.settings.environment.get(BLACKWELL_PTXAS):  # the profile's path, left out of the render
            used += f" (no toolkit ptxas for sm_121a at {SYSTEM_PTXAS}: the profile's path is not rendered)"
    return ok(f"Triton {triton or '(3.6+ or the CUDA 13 ptxas)'} assembles sm_121 with {used}", **evidence)


SYSTEM_PTXAS = "/usr/local/cuda/bin/ptxas"
BLACKWELL_PTXAS = "TRITON_PTXAS_BLACKWELL_PATH"


def triton_version(ctx: Context) -> str | None:
    """The Triton the venv will hold: the resolved wheels' (a planned install), else the venv's."""
    for name in ctx.resolved_wheels or ():
        found = re.match(r"(?:pytorch_)?triton-([0-9][^-]*)-", name)
        if found:
            return found.group(1)
    packages = (ctx.facts.venv.packages or {}) if ctx.facts.venv else {}
    return packages.get("triton") or packages.get("pytorch_triton")


@rule("config.nccl_library", WARNING, engines=("vllm",))
def config_nccl_library(ctx: Context) -> Finding | None:
    """Two DGX Sparks serving one model: the NCCL library vLLM's pynccl (its tensor-parallel all-reduce)
    loads. Unset, VLLM_NCCL_SO_PATH leaves it pip's nvidia-nccl (the one the venv's torch loads); set,
    pynccl loads the file it names (vllm/utils/nccl.py find_nccl_library, 0.33.0 and 0.34.0), which
    should be the system's libnccl2 on this host: another path is named as a fault. The finding names
    that library's path. What a release of pip's NCCL does across two Sparks is a known issue's, judged
    for its own releases (known.spark-pip-nccl-allreduce-wedge: pip's 2.28.9, vllm #42354)."""
    if not (ctx.cluster and ctx.cluster.multi_node) or ctx.profile.gpu is None \
            or ctx.profile.gpu.compute_capability != "12.1":
        return None
    pip = pip_nccl(ctx)
    system = ctx.facts.system_nccl
    named = ctx.env("VLLM_NCCL_SO_PATH")
    evidence = {"pip_nccl": pip, "system_nccl": system.version if system else None, "VLLM_NCCL_SO_PATH": named}
    if system is None:
        why = ctx.facts.notes.get("system_nccl") or "dpkg knows no libnccl2"
        return ok(f"no system NCCL ({why}): the server loads "
                  + (f"{named} (VLLM_NCCL_SO_PATH)" if named else f"pip's NCCL {pip}" if pip else "the venv's"),
                  **evidence)
    library = f"{system.library_dir}/libnccl.so.2"
    if named == library:
        return ok(f"vLLM's pynccl loads the system's NCCL {system.release} ({library})"
                  + (f"; torch pip's {pip}" if pip else ""), library=library, **evidence)
    if named:
        return warn(f"VLLM_NCCL_SO_PATH names {named}, not the system's libnccl2 {system.version} ({library})",
                    f"environment VLLM_NCCL_SO_PATH={library}, or leave it unset for pip's NCCL",
                    library=library, **evidence)
    if pip is None:
        return ok("the venv holds no pip NCCL: the server loads the system's", library=library, **evidence)
    # Whether this release of pip's NCCL is one a report names is the known issue's to say.
    return ok(f"the server loads pip's NCCL {pip}, not the system's libnccl2 {system.version}; "
              f"VLLM_NCCL_SO_PATH={library} would make vLLM's pynccl load the system's ({PIP_NCCL_WEDGE} "
              f"judges pip's {pip})", library=library, **evidence)


def pip_nccl(ctx: Context) -> str | None:
    """The nvidia-nccl wheel the venv holds or the planned wheels bring ('2.28.9'), None where neither
    does (unknown before the venv exists and with no wheels planned)."""
    dists = (ctx.facts.venv.dists or {}) if ctx.facts.venv else {}
    return ctx.planned_nccl or dists.get("nvidia_nccl_cu13") or dists.get("nvidia_nccl_cu12")


@rule("config.nccl_values", WARNING)
def config_nccl_values(ctx: Context) -> Finding | None:
    """NCCL drops a value it does not know without a word and keeps its default: NCCL_P2P_LEVEL and
    NCCL_NET_GDR_LEVEL take one of its path types or an old-style digit (ncclGetLevel, src/graph/
    paths.cc, 2.26 to 2.30; "PCI" is none). The values each release takes are the contract table's
    (engine nccl, kind value); judged for the venv's NCCL, else the table's target release."""
    table = contracts.load()
    version = ctx.facts.venv.nccl if ctx.facts.venv and ctx.facts.venv.nccl else None
    release = version or table.target("nccl")
    known: dict[str, str] = {}
    ignored: dict[str, str] = {}
    for name, value in sorted(ctx.environment.items()):
        accepted = table.values("nccl", name, release)
        if accepted is None:
            continue
        # An old-style level: NCCL reads a leading digit with strtol (clamped to SYS).
        if value in accepted or value[:1].isdigit():
            known[name] = value
        else:
            ignored[name] = f"{value} (NCCL {release} takes {', '.join(accepted)})"
    if ignored:
        return fail(f"NCCL {release} ignores " + "; ".join(f"{k}={v}" for k, v in ignored.items()),
                    "set a value NCCL knows (see provision/engine_contracts.yaml, engine nccl)",
                    nccl=release, ignored=ignored)
    if not known:
        return None
    return ok(f"NCCL {release} reads " + ", ".join(f"{k}={v}" for k, v in known.items()), nccl=release, **known)


def rendered_environment(ctx: Context) -> dict[str, str]:
    """The service's EnvironmentFile as the renderer writes it, unquoted; the inventory's environment
    where it cannot render yet (a cluster node without a link: cluster.network says why)."""
    try:
        rendered = render.service_environment(ctx)
    except ProvisionError:
        return ctx.environment
    return {name: re.sub(r'\\(["\\])', r"\1", value[1:-1]) if value[:1] == '"' else value
            for name, value in rendered}


def files_value(files: Mapping[str, Mapping[str, str]], name: str) -> str:
    """The value NCCL takes for `name` from the files: the user's file first, then /etc/nccl.conf."""
    for path in sorted(files, key=lambda path: path == "/etc/nccl.conf"):
        if name in files[path]:
            return files[path][name]
    return ""


@rule("config.nccl_conf", WARNING, engines=tuple(e.name for e in catalog.ENGINES.values() if e.uses_nccl))
def config_nccl_conf(ctx: Context) -> Finding | None:
    """An nccl.conf on the host sets what the service's environment leaves unset (images ship
    /etc/nccl.conf with NCCL_IB_USE_INLINE=1). NCCL's rule (src/misc/param.cc, setEnvFile and
    initEnv, 2.x to 2.30): it reads $NCCL_CONF_FILE if set, else the home of the user it runs as
    (getpwuid, not $HOME) + /.nccl.conf, then /etc/nccl.conf, and sets each NAME=VALUE with
    setenv(name, value, 0): a variable already in the environment is never replaced, and the first
    file that names one wins. So a rendered variable always beats the files; a file's variable the
    rendered environment lacks takes effect unseen: that is the warning. A file that names a rendered
    variable with another value is shown (NCCL ignores it there: a shell without the service's
    environment, nccl-tests run by hand, still gets the file's)."""
    if not ctx.facts.nccl_conf and "nccl_conf" not in ctx.facts.unreadable:
        return None
    rendered = rendered_environment(ctx)
    own = rendered.get("NCCL_CONF_FILE")
    user_home = str(ctx.facts.users.get(ctx.settings.service_user, {}).get("home") or "")
    files = {path: values for path, values in ctx.facts.nccl_conf.items()
             if path == "/etc/nccl.conf" or (not own and user_home and path.startswith(user_home.rstrip("/") + "/"))}
    applied: dict[str, str] = {}  # NAME -> "VALUE (from PATH)": what NCCL takes from the files
    ignored: dict[str, str] = {}  # NAME -> "file VALUE, rendered VALUE"
    # NCCL reads the user's file first: it wins over /etc/nccl.conf for the same name.
    for path in sorted(files, key=lambda path: path == "/etc/nccl.conf"):
        for name, value in files[path].items():
            if name in rendered:
                if rendered[name] != value:
                    ignored.setdefault(name, f"{path} says {value}, rendered {rendered[name]} (the environment wins)")
            elif name.startswith("NCCL_"):
                applied.setdefault(name, f"{value} (from {path}; rendered: unset)")
    evidence: dict[str, Any] = {"files": {path: dict(values) for path, values in files.items()}}
    if own:
        evidence["NCCL_CONF_FILE"] = own + " (rendered: NCCL reads it instead of ~/.nccl.conf; not inspected)"
    if "nccl_conf" in ctx.facts.unreadable:
        return warn(f"could not be checked: {ctx.facts.notes.get('nccl_conf', 'an nccl.conf is unreadable')}",
                    "make the nccl.conf NAME=VALUE lines only", **evidence)
    if ignored:
        evidence["ignored"] = ignored
    if applied:
        return warn("an nccl.conf sets what the service's environment does not: "
                    + "; ".join(f"{name}={value}" for name, value in sorted(applied.items())),
                    "remove the lines from the file, or name each in the inventory's environment (a rendered "
                    "value wins over the file), e.g. to keep the file's: --set environment='{"
                    + ", ".join(f'{name}: "{files_value(files, name)}"' for name in sorted(applied)) + "}'",
                    applied=applied, **evidence)
    return ok("every variable the nccl.conf files set is in the rendered environment, which wins"
              + (f" ({len(ignored)} file value(s) differ and are ignored)" if ignored else ""), **evidence)


@rule("config.attention_backend", WARNING, engines=("vllm",))
def config_attention_backend(ctx: Context) -> Finding | None:
    """VLLM_ATTENTION_BACKEND and --attention-backend as engine_contracts.yaml dates them: the variable is
    deprecated once the flag exists (0.13.0) and ignored without a word from 0.15.0; use the flag."""
    backend = ctx.env("VLLM_ATTENTION_BACKEND")
    if backend is None:
        return None
    table = contracts.load()
    version = vllm_version(ctx)
    judged = version or f"{table.target('vllm')} (the target; the host's version is not known)"
    evidence = {"VLLM_ATTENTION_BACKEND": backend, "vllm": version}
    fix = f"extra_args: [--attention-backend, {backend}] instead of the variable"
    if not table.accepts("vllm", "env", "VLLM_ATTENTION_BACKEND", version):
        return fail(f"vLLM {judged} ignores VLLM_ATTENTION_BACKEND", fix, **evidence)
    if table.accepts("vllm", "flag", "--attention-backend", version):
        return fail(f"VLLM_ATTENTION_BACKEND is deprecated in vLLM {judged}", fix, **evidence)
    return ok(f"vLLM {judged} reads VLLM_ATTENTION_BACKEND (it has no --attention-backend yet)", **evidence)


@rule("config.concurrent_sequences", WARNING)
def config_concurrent_sequences(ctx: Context) -> Finding | None:
    """concurrent_sequences is the slot count of an engine that holds every sequence's KV cache from its
    start (llama.cpp's --parallel, engines/llamacpp.py). An engine with one KV pool that requests take
    blocks of does not read it: its own bound is a server flag (vLLM's --max-num-seqs, TensorRT-LLM's
    --max_batch_size), so the setting is said to do nothing there rather than ignored. On llama.cpp it
    passes, naming the slots."""
    count = ctx.settings.concurrent_sequences
    if count is None:
        return None
    engine = engine_of(ctx.settings)
    if engine.kv_slots(ctx.settings, 1) is not None:
        return ok(f"{engine.title} serves {count} sequences at once, each in a slot of its own holding "
                  "max_model_len (memory.fits counts every slot)", concurrent_sequences=count, engine=engine.name)
    flag = engine.concurrency_flag
    fix = (f"--set server_flags='{{{flag}: {count}}}' for {engine.title}'s own bound, and leave "
           "concurrent_sequences unset") if flag else "leave concurrent_sequences unset"
    return fail(f"concurrent_sequences ({count}) is llama.cpp's slot count: {engine.title} does not read it",
                fix, concurrent_sequences=count, engine=engine.name, **({"flag": flag} if flag else {}))


# ---------------------------------------------------------------------------------------------
# Multi-GPU and multi-node


@rule("pcie.link", WARNING)
def pcie_link(ctx: Context) -> Finding | None:
    """Multi-GPU over PCIe: a link below the GPU's generation or narrower than its width halves the
    all-reduce bandwidth. Generation is judged on pcie.link.gen.max (what GPU and slot can reach), since
    idle cards drop their current generation."""
    expectation = ctx.profile.gpu
    gpus = ctx.facts.gpus or ()
    if expectation is None or expectation.pcie_gen is None or len(gpus) < 2:
        return None
    slow = {str(gpu.index): {"gen_max": gpu.pcie_gen_max, "width": gpu.pcie_width_current,
                             "width_max": gpu.pcie_width_max}
            for gpu in gpus
            if (gpu.pcie_gen_max or 0) < expectation.pcie_gen
            or (gpu.pcie_width_current or 0) < (gpu.pcie_width_max or 0)}
    if slow:
        return fail(f"GPU(s) {', '.join(slow)} link below Gen{expectation.pcie_gen} or below full width",
                    "move the cards to full-width Gen5 slots (check the BIOS PCIe settings)", links=slow)
    return ok(f"every link Gen{expectation.pcie_gen}, full width")


@rule("nccl.version", BLOCKER)
def nccl_version(ctx: Context) -> Finding | None:
    """NCCL 2.25 fails on RTX 5090 (ncclMaxSharedMem exceeds the device's); fixed in 2.26.2 (nccl #1637).
    Read from the installed venv's torch; skipped until the venv exists."""
    minimum = ctx.profile.nccl_minimum
    if minimum is None or ctx.facts.venv is None or ctx.facts.venv.nccl is None:
        return None
    found = ctx.facts.venv.nccl
    if version_tuple(found) >= version_tuple(minimum):
        return ok(f"NCCL {found}", nccl=found, minimum=minimum)
    return fail(f"NCCL {found} is older than {minimum}", "install a torch build with NCCL >= 2.26.2",
                nccl=found, minimum=minimum)


@rule("venv.arch", BLOCKER)
def venv_arch(ctx: Context) -> Finding | None:
    """The venv's torch must carry kernels for the host's GPU ("no kernel image is available" otherwise,
    vllm #13306); sm_121 runs sm_120 code (published wheels have no sm_121, facts section 2)."""
    if ctx.profile.gpu is None or ctx.facts.venv is None or not ctx.facts.venv.arch_flags:
        return None
    targets = ctx.facts.venv.sm_targets
    wanted = ctx.profile.gpu.compute_capability
    compatible = {wanted} | ({"12.0"} if wanted == "12.1" else set())
    if compatible & set(targets):
        return ok(f"torch built for {', '.join(targets)}", targets=list(targets))
    return fail(f"torch in the venv has no kernels for sm_{wanted.replace('.', '')} (has {', '.join(targets)})",
                f"install a build with TORCH_CUDA_ARCH_LIST={ctx.profile.cuda.torch_cuda_arch_list if ctx.profile.cuda else wanted}",
                targets=list(targets), wanted=wanted)


@rule("venv.requirements", BLOCKER)
def venv_requirements(ctx: Context) -> Finding | None:
    """The serving engine's own requirements (the Requires-Dist lines of its dist-info METADATA) met by
    the venv that will serve: vLLM 0.33.0 declares torch==2.14.0 and flashinfer-python==0.7.2.post1
    (its wheel's METADATA); beside torch 2.13.0 (a `pip install --no-deps`, torch upgraded alone) it
    installs and fails at import. Judged as `pip check` does (provision/venvreqs.py), markers in the
    venv python's own environment. A venv the next apply rebuilds is not the one that will serve: its
    wheels were resolved together by pip, which holds each to the others' Requires-Dist."""
    venv_dir = ctx.settings.venv_dir.rstrip("/")
    if ctx.venv_rebuilt:
        return ok(f"the next apply rebuilds {venv_dir} from {len(ctx.resolved_wheels or ())} wheels pip resolved "
                  "together (it holds them to each other's requirements); the venv there now does not serve and "
                  "was not judged", judged="the planned install", venv=venv_dir)
    venv = ctx.facts.venv
    if venv is None:
        return None  # no venv and none planned: nothing is installed to judge
    judged = f"the installed venv {venv_dir}"
    dists = contracts.load().engines[ctx.settings.engine].packages
    if venv.requires is None or venv.dists is None or venv.markers is None:
        return warn(f"could not be checked: {venv_dir} was read by a probe that did not read its engine's "
                    "requirements", f"gather the facts again (`{hints.command('facts')}`): today's probe reads them",
                    judged=judged, venv=venv_dir)
    read = [dist for dist in dists if dist in venv.requires]
    if not read:
        return None  # the venv holds no distribution of this engine (a source build's binary, say)
    unreadable = {dist: venv.requires_errors.get(dist, "unread") for dist in read if venv.requires[dist] is None}
    if unreadable:
        return warn(f"could not be checked: the METADATA of {', '.join(unreadable)} in {venv_dir} could not be "
                    f"read ({'; '.join(unreadable.values())})", "reinstall the engine in that venv",
                    judged=judged, venv=venv_dir)
    missing = {f"{dist} {venv.dists.get(dist, '')}".strip(): venvreqs.unmet(venv.requires[dist] or (), venv.dists,
                                                                            venv.markers)
               for dist in read}
    evidence: dict[str, Any] = {"judged": judged, "venv": venv_dir, "engine": list(missing)}
    # What the profile uninstalls after every install on purpose (the CPU profile: PyPI's torchvision,
    # torchaudio and torchcodec fail to import beside a CPU torch) is absent by design, not a fault.
    removed = {venvreqs.canonical(name) for name in ctx.profile.venv_remove}
    left_out = sorted({item.name for items in missing.values() for item in items
                       if not item.installed and venvreqs.canonical(item.name) in removed})
    problems = [(engine, item) for engine, items in missing.items() for item in items if item.name not in left_out]
    if left_out:
        evidence["removed_by_profile"] = left_out
    if not problems:
        count = sum(len(venv.requires[dist] or ()) for dist in read)
        removed_note = (f" ({', '.join(left_out)} left out on purpose: the {ctx.profile.name} profile's venv_remove)"
                        if left_out else "")
        return ok(f"{', '.join(missing)} in {venv_dir}: its Requires-Dist lines ({count}) that apply to Python "
                  f"{venv.markers.get('python_full_version')} on {venv.markers.get('platform_machine')} are met"
                  + removed_note, **evidence)
    fixable = [item.requirement for _, item in problems if not item.why]
    installer = f"{venv_dir}/bin/pip install" if "pip" in venv.dists else \
        f"uv pip install --python {venv_dir}/bin/python"  # a venv made without pip (uv's) has no bin/pip
    pins = " ".join(f"{dist.replace('_', '-')}=={venv.dists[dist]}" for dist in read if dist in venv.dists)
    rebuild = (f"remove {venv_dir}/{VENV_MANIFEST} (the venv changed after the tool built it) and apply: the "
               "tool rebuilds it from the wheels pip resolved" if ctx.resolved_wheels is not None
               else f"set engine_spec: {pins} so the tool installs a set pip resolves together")
    fix = (f"{installer} {' '.join(shlex.quote(text) for text in fixable)}, or " if fixable else "") + rebuild
    return fail(f"{judged} does not meet its engine's own requirements: "
                + "; ".join(f"{engine} requires {item.shown}" for engine, item in problems),
                fix, unmet={item.requirement: item.installed or "not installed" for _, item in problems}, **evidence)


@rule("cluster.network", BLOCKER)
def cluster_network(ctx: Context) -> Finding | None:
    """Each node needs an interface on the cluster network: its VLLM_HOST_IP, NCCL_SOCKET_IFNAME and
    GLOO_SOCKET_IFNAME come from it, and names differ per node (NVIDIA dgx-spark-playbooks)."""
    if ctx.cluster is None or not ctx.cluster.multi_node:
        return None
    network = cluster_network_of(ctx)
    if network is None:
        return fail("the cluster network is unknown", "--set cluster_network=CIDR (the nodes' shared subnet)",
                    head_address=ctx.head_address)
    if ctx.facts.interfaces is None:
        return unknown("the host's interfaces", ctx, "interfaces")
    for interface in ctx.facts.interfaces:
        for address in interface.addresses:
            if ipaddress.ip_interface(address).ip in network:
                return ok(f"{interface.name} {address} on {network}", interface=interface.name,
                          address=address, network=str(network))
    return fail(f"no interface on the cluster network {network}",
                "connect this node to the cluster network or set cluster_network", network=str(network),
                interfaces={i.name: list(i.addresses) for i in ctx.facts.interfaces if i.name != "lo"})


@rule("cluster.rdma", WARNING)
def cluster_rdma(ctx: Context) -> Finding | None:
    """Multi-node NCCL wants RDMA (the Spark's CX-7 twins: NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1); without it
    NCCL falls back to sockets."""
    if ctx.cluster is None or not ctx.cluster.multi_node:
        return None
    links = [link for link in ctx.facts.rdma or () if link.up]
    if not links:
        return fail("no RDMA link up: NCCL will use TCP sockets", "cable the CX-7/ConnectX ports and "
                    "bring them up", rdma=ctx.facts.notes.get("rdma") or "none up")
    return ok(f"NCCL_IB_HCA={','.join(link.device for link in links)}",
              NCCL_IB_HCA=",".join(link.device for link in links), netdevs=[link.netdev for link in links])


# ---------------------------------------------------------------------------------------------
# Known issues: one rule per entry of provision/known_issues.yaml (version-dependent traps as data)


def known_issue_rule(issue: known_issues.KnownIssue) -> Callable[[Context], Finding | None]:
    def check(ctx: Context) -> Finding | None:
        if ctx.settings.engine not in issue.engines:
            return None  # another engine's trap
        found = known_issues.judge(issue, issue_evidence.evidence_of(ctx))
        return None if found is None else Finding(
            "", found.severity, found.status, found.message, found.evidence, found.fix)

    check.__doc__ = f"{issue.title} ({issue.source}; data: provision/known_issues.yaml)."
    return check


for _issue in known_issues.load():
    rule(_issue.id, _issue.severity)(known_issue_rule(_issue))


# ---------------------------------------------------------------------------------------------
# Running the gate


def evaluate(ctx: Context, force: Iterable[str] = ()) -> list[Finding]:
    """Every rule on one host, in checklist order; forced blockers are marked, not hidden."""
    forced = set(force)
    findings = []
    for rule_id, _, run in RULES:
        finding = run(ctx)
        if finding.blocks and rule_id in forced:
            finding = replace(finding, status=FORCED)
        findings.append(finding)
    return findings


def verdict(findings: Sequence[Finding]) -> str:
    if any(finding.blocks for finding in findings):
        return "blocked"
    if any(finding.status == FAIL for finding in findings):
        return "warnings"
    return "ok"


def resolutions(findings: Sequence[Finding]) -> list[str]:
    """Extra server arguments the gate decided on (e.g. --disable-custom-all-reduce)."""
    extra: list[str] = []
    for finding in findings:
        extra.extend(arg for arg in finding.resolution.get("extra_args", []) if arg not in extra)
    return extra


RULE_IDS = tuple(rule_id for rule_id, _, _ in RULES)
