"""What a host and its settings say about each known issue's matchers (provision/known_issues.py's
Evidence), read from a check Context. Apart from known_issues, which judges the data and knows no
Context: the Context reads known_issues (the NVLS trap's range), so the two would tie each other."""
from __future__ import annotations

from provision.context import Context
from provision.known_issues import (
    ALIASES,
    VERSION_KEYS,
    Evidence,
    arg_value,
    pinned_versions,
    wheel_versions,
)


def evidence_of(ctx: Context) -> Evidence:
    """What the host and its settings say about each matcher (see the module docstring)."""
    versions: dict[str, str] = {}
    absent: set[str] = set()
    notes: dict[str, str] = {}
    venv = ctx.facts.venv
    if venv is None:
        why = ctx.facts.notes.get("venv") or "no venv yet"
        notes = {key: f"{why}; pin it in engine_spec ({key}==VERSION) to check before apply"
                 for key in VERSION_KEYS}
    else:
        found: dict[str, str | None] = {"vllm": venv.vllm, "torch": venv.torch, "nccl": venv.nccl}
        if venv.packages is None:
            notes.update({key: "the venv's record predates reading it; any change to the venv re-reads it"
                          for key in VERSION_KEYS if key not in found})
        else:
            for name, installed in venv.packages.items():
                key = ALIASES.get(name, name)
                if key in VERSION_KEYS:
                    found[key] = found.get(key) or installed
            found.update({key: found.get(key) for key in VERSION_KEYS})
        for key, version in found.items():
            if version:
                versions[key] = version
            else:
                absent.add(key)
    # The planned wheels are what the next apply installs, as exact pins are, and what those pins pin
    # in turn (vllm==0.34.0 brings torch 2.14.0 and nvidia-nccl-cu13 2.30.7: the contract table's
    # dependency rows), where no wheels are planned yet.
    brought = {ALIASES.get(name, name): release for name, release in ctx.pinned_stack.items()}
    for key, version in {**(brought if ctx.resolved_wheels is None else {}),
                         **wheel_versions(ctx.resolved_wheels or ()),
                         **pinned_versions(ctx.settings.engine_spec)}.items():
        versions[key] = version
        absent.discard(key)
        notes.pop(key, None)
    caps = tuple(sorted({gpu.compute_cap for gpu in ctx.facts.gpus or () if gpu.compute_cap}))
    if not caps and ctx.profile.gpu is not None:
        caps = (ctx.profile.gpu.compute_capability,)  # before nvidia-smi answers: what the profile expects
    arch = ctx.facts.arch or (ctx.profile.arch if ctx.profile.arch != "any" else None)
    args = tuple(str(arg) for arg in ctx.settings.extra_args)
    flag = arg_value(args, "--quantization")[1] or arg_value(args, "-q")[1]
    quantization = flag.lower() if flag else ctx.quantization
    if quantization is None:
        notes["quantization"] = "the model's config.json was not read (no hub model, or the hub refused)"
    if arch is None:
        notes["arch"] = ctx.facts.notes.get("uname", "uname -m unknown")
    if ctx.facts.cpu_flags is None:
        notes["cpu_flags"] = ctx.facts.notes.get("cpu_flags", "/proc/cpuinfo unread")
    if ctx.facts.memory is None:
        notes["kernel_cma"] = ctx.facts.notes.get("meminfo", "/proc/meminfo unread")
    if ctx.model_config is None:
        notes["moe"] = ctx.model_config_note or "the model's config.json was not read"
    venv_dists = None
    if venv is not None and venv.dists is not None:
        venv_dists = {**venv.dists, **({"torch": venv.torch} if venv.torch else {})}
    if ctx.resolved_wheels is None:
        notes["wheels"] = "no wheels planned (no engine_spec or venv_wheels, or a source build)"
        notes["installed"] = ("no venv yet" if venv is None else
                              "the venv's record predates listing its distributions; any change to the venv re-reads it")
    return Evidence(versions=versions, absent=frozenset(absent), compute_capability=caps, arch=arch,
                    cpu_flags=ctx.facts.cpu_flags, quantization=quantization, args=args,
                    env=ctx.environment,
                    multi_node=bool(ctx.cluster and ctx.cluster.multi_node), multi_gpu=ctx.parallel > 1,
                    moe=None if ctx.experts is None else ctx.experts > 0,
                    kernel_cma=ctx.facts.memory.cma_state if ctx.facts.memory else None,
                    kernel_cma_detail=_cma_detail(ctx),
                    wheels=ctx.resolved_wheels, installed=venv_dists, unreachable=dict(ctx.facts.reachable),
                    notes=notes)


def _cma_detail(ctx: Context) -> str | None:
    """'CmaTotal 0 kB, CmaFree 940604 kB; kernel 7.0.0-1019-nvidia, no kho= on its command line'."""
    memory = ctx.facts.memory
    if memory is None:
        return None
    lines = ("no Cma lines in /proc/meminfo" if memory.cma_total is None or memory.cma_free is None
             else f"CmaTotal {memory.cma_total // 1024} kB, CmaFree {memory.cma_free // 1024} kB")
    cmdline = ctx.facts.kernel_cmdline
    kho = ("command line unread" if cmdline is None
           else f"kho={cmdline['kho']}" if cmdline.get("kho") is not None else "no kho= on its command line")
    return f"{memory.cma_state}: {lines}; kernel {ctx.facts.kernel or 'unknown'}, {kho}"
