"""The interconnect check: an all-reduce bandwidth test across GPUs, in the service's own environment.

Controller side of `invoke verify.nccl`. For one host it starts one process per GPU there; for a
multi-node cluster, the same on every node at once, all joined in one NCCL group whose rendezvous is the
head's address on the cluster network. Each node receives `host/nccl.py` on stdin (one remote execution
per node, through `remote.py`), runs it with the venv's python (else `python3`) and answers JSON.

The environment is what `render.service_environment` renders for that node's vLLM service (the
profile's NCCL settings, the inventory's, and on multi-node clusters each node's own NCCL_SOCKET_IFNAME,
GLOO_SOCKET_IFNAME and NCCL_IB_HCA), plus torchrun's variables and NCCL_DEBUG=INFO so that NCCL says in
its own log which transport it chose. It travels inside the program on stdin, never in argv: the
service environment may hold a token.

Figures follow nccl-tests (doc/PERFORMANCE.md there): algbw = bytes / time of one all-reduce, and
busbw = algbw * 2(n-1)/n, the rate each link carries in a ring all-reduce over n ranks, comparable
with the hardware's link bandwidth whatever n is. GB/s are 10^9 bytes per second. The time is taken as
nccl-tests takes it (src/common.cu there): a batch of `iters` all-reduces queued back to back, timed
from its start to its end, divided by `iters`; here between two CUDA events on the stream, with the
batch queued behind a GPU-side hold so that Python's cost per call (40-50 us) stays out of it
(host/nccl.py says how). A size whose batch the GPU still reached before the host had queued it is
marked `late`: its time has the host's pace in it.

Everything below `run_node` is pure: the parsers of NCCL's log and of the program's answer are tested
on a log recorded on a real 2x H200 node (tests/fixtures/nccl/).
"""
from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from provision import config, hints, programs, remote, render
from provision.errors import CommandFailed, ParseError, ProvisionError, RenderError
from provision.fanout import for_each_host
from provision.inventory import Host, Inventory

if TYPE_CHECKING:
    from provision.context import Context
    from provision.run import Options
    from provision.runner import Runner
    from provision.taskargs import NcclFlags


# NCCL prints its choices at INFO level: INIT has the channel connections ("via P2P/CUMEM/read"),
# GRAPH the path type of each searched graph ("type NVL/PIX"), ENV the variables it took from the
# environment ("NCCL_NVLS_ENABLE set by environment to 0"), NET the network it uses.
DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,GRAPH,ENV,NET"}
DEFAULT_PORT = config.NCCL_PORT  # torchrun's default rendezvous port
DEFAULT_MIN_BYTES = 1 << 20
DEFAULT_MAX_BYTES = 1 << 30
FLOAT32 = 4

# ---------------------------------------------------------------------------------------------
# Sizes and bandwidth

_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]?)(?:i?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'1M' -> 1048576, '512K', '1G', '4096' (binary units, as nccl-tests reads -b/-e)."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"not a size: {text!r} (examples: 4096, 512K, 1M, 1G)")
    value = int(match.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[match.group(2).upper()]
    if value < FLOAT32:
        raise ValueError(f"a size below {FLOAT32} bytes (one float32): {text!r}")
    return value


def sizes_between(low: int, high: int, factor: int = 2) -> tuple[int, ...]:
    """low, low*factor, ... up to high (both included when high is on the way), in whole float32s."""
    if low > high:
        raise ValueError(f"the smallest size ({low}) is above the largest ({high})")
    if factor < 2:
        raise ValueError("the step factor must be 2 or more")
    sizes = []
    size = low
    while size <= high:
        sizes.append(size - size % FLOAT32)
        size *= factor
    return tuple(sizes)


def bus_factor(ranks: int) -> float:
    """busbw / algbw for all-reduce: 2(n-1)/n (nccl-tests)."""
    return 2 * (ranks - 1) / ranks if ranks > 0 else 0.0


@dataclass(frozen=True)
class Bandwidth:
    """One message size: Bandwidth(bytes=1073741824, count=268435456, time_us=2980.1,
    algbw_gbs=360.3, busbw_gbs=360.3, wrong=0). `late`: the host's pace is in the time."""

    bytes: int
    count: int
    time_us: float
    algbw_gbs: float
    busbw_gbs: float
    wrong: int
    late: bool = False


def bandwidth(nbytes: int, count: int, seconds: float, ranks: int, wrong: int = 0,
              late: bool = False) -> Bandwidth:
    algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    return Bandwidth(bytes=nbytes, count=count, time_us=round(seconds * 1e6, 2),
                     algbw_gbs=round(algbw, 2), busbw_gbs=round(algbw * bus_factor(ranks), 2),
                     wrong=wrong, late=late)


def human_size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


# ---------------------------------------------------------------------------------------------
# NCCL's INFO log


@dataclass(frozen=True)
class ChannelLink:
    """One connection NCCL set up, from a line like

        host:1234:1234 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
        host:1234:1290 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0

    ChannelLink(channel=0, source=0, target=1, direction=None, via='P2P/CUMEM/read'). The device in
    brackets is a CUDA index in recent NCCL and a bus id in older ones; it is not kept.
    """

    channel: int
    source: int
    target: int
    direction: str | None  # "send" / "receive" for network connections, None within a node
    via: str

    @property
    def transport(self) -> str:
        """The transport's name: P2P, SHM, NET, COLLNET, NVLS."""
        return self.via.split("/")[0]


@dataclass(frozen=True)
class NcclLog:
    """What NCCL said about itself: version, connections, graph path types, settings it read."""

    version: str | None
    links: tuple[ChannelLink, ...]
    paths: tuple[str, ...]  # graph path types, intra/inter, e.g. ("NVL/PIX",)
    network: str | None  # "Socket", "IB", ... from "Using network X"
    environment: Mapping[str, str]  # "NCCL_X set by environment to Y"
    nranks: int | None
    nnodes: int | None
    nvls_channels: int | None = None  # "24 coll channels, ..., 0 nvls channels, ...": 0 = NVLS unused
    nvlink_gbs: float | None = None  # a GPU's NVLink bandwidth in NCCL's topology ("+ NVL[370.8] - ...")
    nvswitch: bool = False  # the GPUs' NVLinks end on an NVSwitch ("+ NVL[370.8] - NVS/0-0")
    warnings: tuple[str, ...] = ()

    @property
    def transports(self) -> dict[str, int]:
        """{'P2P/CUMEM/read': 48}: how many channel connections use each transport."""
        return dict(Counter(link.via for link in self.links).most_common())


_PREFIX = r"^(?:\S+:\d+:\d+ \[\d+\] )?NCCL (INFO|WARN) "
_LINE = re.compile(_PREFIX + r"(.*?)\s*$")
_CHANNEL = re.compile(r"^Channel (\d+)(?:/\d+)? : (\d+)\[[0-9a-fA-Fx]+\] -> (\d+)\[[0-9a-fA-Fx]+\]"
                      r"(?: \[(send|receive)\])? via (.+)$")
_VERSION = re.compile(r"^NCCL version (\S+)")
_PATTERN = re.compile(r"^Pattern \d+, crossNic \d+, nChannels \d+, .*\btype ([A-Z0-9]+/[A-Z0-9]+)")
_NETWORK = re.compile(r"^Using network (\S+)")
# "NCCL_X set by environment to Y" (src/misc/param.cc for the integer ones, each module for its own
# strings), "NCCL_IB_HCA set to Y" (src/transport/net_ib/init.cc) and "NCCL_SOCKET_IFNAME set to Y".
_SET = re.compile(r"^(NCCL_\w+) set (?:by environment )?to (.*)$")
_COMM = re.compile(r"\bnRanks (\d+) nNodes (\d+)\b")
_TOPO_NVL = re.compile(r"^\+ NVL\[([\d.]+)\] - (GPU|NVS|CPU)/")
_CHANNELS = re.compile(r"^\d+ coll channels, .*?\b(\d+) nvls channels\b")


def parse_nccl_log(text: str) -> NcclLog:
    """Read NCCL_DEBUG=INFO output (one rank's or several ranks' concatenated); lines that are not
    NCCL's are ignored. A log without any NCCL line raises ParseError: NCCL_DEBUG was not honoured."""
    version = network = None
    nranks = nnodes = nvls_channels = None
    nvlink_gbs: float | None = None
    nvswitch = False
    links: dict[tuple[int, int, int, str | None], ChannelLink] = {}
    paths: list[str] = []
    environment: dict[str, str] = {}
    warnings: list[str] = []
    seen = False
    for raw in text.splitlines():
        line = _LINE.match(raw.strip())
        if not line:
            continue
        seen = True
        level, message = line.group(1), line.group(2)
        if level == "WARN":
            warnings.append(message)
            continue
        if match := _CHANNEL.match(message):
            link = ChannelLink(int(match.group(1)), int(match.group(2)), int(match.group(3)),
                               match.group(4), match.group(5).strip())
            links.setdefault((link.channel, link.source, link.target, link.direction), link)
        elif match := _VERSION.match(message):
            version = version or match.group(1)
        elif match := _PATTERN.match(message):
            if match.group(1) not in paths:
                paths.append(match.group(1))
        elif match := _NETWORK.match(message):
            network = network or match.group(1)
        elif match := _SET.match(message):
            environment[match.group(1)] = match.group(2).rstrip(".")
        elif match := _COMM.search(message):
            nranks, nnodes = int(match.group(1)), int(match.group(2))
        elif match := _CHANNELS.match(message):
            nvls_channels = int(match.group(1))
        elif match := _TOPO_NVL.match(message.strip()):
            nvlink_gbs = max(nvlink_gbs or 0.0, float(match.group(1)))
            nvswitch = nvswitch or match.group(2) == "NVS"
    if not seen:
        raise ParseError("nccl", "no NCCL INFO line (was NCCL_DEBUG=INFO honoured?)", text)
    ordered = tuple(sorted(links.values(), key=lambda l: (l.channel, l.source, l.target, l.direction or "")))
    return NcclLog(version=version, links=ordered, paths=tuple(paths), network=network,
                   environment=environment, nranks=nranks, nnodes=nnodes, nvls_channels=nvls_channels,
                   nvlink_gbs=nvlink_gbs, nvswitch=nvswitch, warnings=tuple(warnings))


# NCCL's path types (src/graph/topo.h): how two GPUs reach each other.
_PATH_NAMES = {"NVL": "NVLink", "NVB": "NVLink through a GPU", "C2C": "NVLink-C2C", "PIX": "PCIe (one switch)",
               "PXB": "PCIe (several switches)", "PXN": "PCIe through a GPU's NIC", "P2C": "PCIe over C2C",
               "PHB": "PCIe through the CPU", "SYS": "PCIe across CPU sockets", "NET": "the network",
               "LOC": "the same device"}


def describe_transport(log: NcclLog) -> str:
    """One line for people: 'P2P/CUMEM/read over NVLink (48 channel connections)'."""
    if not log.links:
        return "no channel connection in the log"
    intra = log.paths[0].split("/")[0] if log.paths else None
    parts = []
    for via, count in log.transports.items():
        kind = via.split("/")[0]
        if kind == "P2P" and intra:
            where = f" over {_PATH_NAMES.get(intra, intra)}"
            if intra == "NVL" and log.nvswitch:
                where += " through NVSwitch"
        elif kind == "SHM":
            where = " (through host memory)"
        elif via.startswith("NET/IB"):
            where = " (InfiniBand/RoCE" + (", GPUDirect RDMA)" if "GDRDMA" in via else ")")
        elif via.startswith("NET/Socket"):
            where = " (TCP sockets)"
        else:
            where = ""
        parts.append(f"{via}{where} ({count} channel connection{'s' if count != 1 else ''})")
    return "; ".join(parts)


@dataclass(frozen=True)
class EnvironmentRead:
    """One NCCL_* variable of the rendered environment and what NCCL's log says it took from it."""

    name: str
    rendered: str
    read: str | None  # as NCCL logged it; None where NCCL logged nothing of it

    @property
    def taken(self) -> bool:
        """NCCL read the value that was rendered (an integer compared as NCCL's strtoll reads it)."""
        return self.read is not None and (self.read == self.rendered or _as_integer(self.rendered) == _as_integer(self.read))

    @property
    def verdict(self) -> str:
        if self.read is None:
            return "not read"
        return "read" if self.taken else f"read as {self.read}"

    @property
    def finding(self) -> str | None:
        """Why the rendered value is not what NCCL runs with; None when it is."""
        if self.taken:
            return None
        if self.read is None:
            return (f"{self.name}={self.rendered} is rendered but NCCL did not say it read it: a value NCCL does "
                    "not know is ignored without a word (NCCL_P2P_LEVEL takes LOC, NVL, NVB, C2C, PIX, PXB, "
                    "PXN, P2C, PHB, SYS), and some variables are read only where they apply")
        return f"{self.name}={self.rendered} is rendered but NCCL read it as {self.read}"


def _as_integer(value: str) -> int | None:
    try:
        return int(value, 0)
    except ValueError:
        try:
            return int(value)
        except ValueError:
            return None


# Variables the check itself adds to the environment: NCCL takes them before it logs anything.
_OWN = frozenset(DEBUG_ENV)


def environment_reads(rendered: Mapping[str, str], log: NcclLog) -> tuple[EnvironmentRead, ...]:
    """Each rendered NCCL_* variable (not the check's own NCCL_DEBUG*) beside what NCCL logged reading."""
    return tuple(EnvironmentRead(name, value, log.environment.get(name))
                 for name, value in sorted(rendered.items()) if name.startswith("NCCL_") and name not in _OWN)


# ---------------------------------------------------------------------------------------------
# The program's answer


@dataclass(frozen=True)
class RankOutcome:
    rank: int
    local_rank: int
    exit: int | None
    timed_out: bool
    log: str
    device: str | None = None  # torch.cuda.get_device_name(), once the rank got that far

    @property
    def ok(self) -> bool:
        return self.exit == 0 and not self.timed_out

    def tail(self, lines: int = 5) -> str:
        useful = [line for line in self.log.splitlines() if line.strip() and " NCCL INFO " not in line]
        return " | ".join(useful[-lines:]) or "no output"


@dataclass(frozen=True)
class NodeAnswer:
    """One node's answer: its ranks' exits and logs, and (head only) the measured rows."""

    host: str
    python: str
    node_rank: int
    ranks: tuple[RankOutcome, ...]
    result: Mapping[str, Any] | None
    raw: str = field(default="", compare=False, repr=False)  # the JSON as answered (for --log-dir)


def parse_answer(host: str, stdout: str) -> NodeAnswer:
    """The JSON that host/nccl.py prints (its shape is in that module's docstring)."""
    try:
        data = json.loads(stdout)
        ranks = tuple(RankOutcome(rank=int(item["rank"]), local_rank=int(item["local_rank"]),
                                  exit=None if item["exit"] is None else int(item["exit"]),
                                  timed_out=bool(item["timed_out"]), log=str(item.get("log") or ""),
                                  device=item.get("device"))
                      for item in data["ranks"])
        result = data.get("result")
        if result is not None:
            for row in result["rows"]:
                int(row["bytes"]), int(row["count"]), float(row["seconds"]), int(row["wrong"])
        return NodeAnswer(host=host, python=str(data["python"]), node_rank=int(data["node_rank"]),
                          ranks=ranks, result=result, raw=stdout)
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ParseError("nccl", f"{host}: the test program did not answer its JSON ({exc})", stdout) from exc


# ---------------------------------------------------------------------------------------------
# Launch plans: who runs which ranks, with which environment


@dataclass(frozen=True)
class NodeLaunch:
    """One node's part of a test: `nproc` ranks from `rank_offset`, run by `python`, in `env`."""

    host: str
    node_rank: int
    nnodes: int
    nproc: int
    rank_offset: int
    world_size: int
    master_addr: str
    master_port: int
    python: str
    env: Mapping[str, str] = field(default_factory=dict)

    def spec(self, sizes: Sequence[int], iters: int, warmup: int, timeout: float) -> dict[str, Any]:
        """What hostnccl.main() receives on this node."""
        return {"nproc": self.nproc, "rank_offset": self.rank_offset, "world_size": self.world_size,
                "node_rank": self.node_rank, "nnodes": self.nnodes, "master_addr": self.master_addr,
                "master_port": self.master_port, "env": dict(self.env), "sizes": list(sizes),
                "iters": iters, "warmup": warmup, "timeout": timeout,
                "init_timeout": max(30, int(timeout / 2)), "backend": "nccl"}


def _unquote(value: str) -> str:
    """Undo render.env_quote: '"a\\"b"' -> 'a"b'."""
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return re.sub(r'\\(["\\])', r"\1", value[1:-1])
    return value


def service_env(ctx: Context) -> dict[str, str]:
    """The variables the host's vLLM service gets (its rendered EnvironmentFile), unquoted."""
    return {name: _unquote(value) for name, value in render.service_environment(ctx)}


def python_of(ctx: Context) -> str:
    """The service venv's python where the venv exists with torch in it (the NCCL vLLM will load),
    else the host's python3 (a host not provisioned yet, or a venv still empty)."""
    if ctx.facts.venv is not None and ctx.facts.venv.torch:
        return f"{str(ctx.settings.venv_dir).rstrip('/')}/bin/python"
    return "python3"


def _gpus_of(ctx: Context, gpus: int | None) -> int:
    if ctx.facts.gpus is None:
        raise ProvisionError(f"{ctx.host}: its GPUs could not be read ({ctx.facts.notes.get('gpus', 'no value')})")
    present = len(ctx.facts.gpus)
    if present == 0:
        note = ctx.facts.notes.get("gpus", "nvidia-smi lists none")
        raise ProvisionError(f"{ctx.host}: no GPU to test ({note})")
    if gpus is not None and gpus > present:
        raise ProvisionError(f"{ctx.host}: --gpus {gpus} but the host has {present} GPU(s)")
    return gpus or present


def plan_host(ctx: Context, *, gpus: int | None = None, port: int = DEFAULT_PORT,
              cluster: str | None = None) -> list[NodeLaunch]:
    """All of one host's GPUs (or the first `gpus`) in one group, rendezvous on the loopback. `cluster`:
    the one-node cluster named with --cluster, so that the hint for one GPU suggests what was not tried."""
    nproc = _gpus_of(ctx, gpus)
    if nproc < 2:
        if gpus == 1 and len(ctx.facts.gpus or ()) > 1:
            hint = f"--gpus 1 of its {len(ctx.facts.gpus or ())}: leave --gpus out, or ask for 2 or more"
        elif cluster is not None:
            hint = (f"cluster {cluster} has this one node: add nodes with GPUs to it (on its cluster network), "
                    "or test a host with several GPUs with --host")
        else:
            hint = "test a multi-node cluster with --cluster"
        raise ProvisionError(f"{ctx.host}: one GPU, nothing to all-reduce across ({hint})")
    env = {**service_env(ctx), **DEBUG_ENV}
    return [NodeLaunch(host=ctx.host, node_rank=0, nnodes=1, nproc=nproc, rank_offset=0, world_size=nproc,
                       master_addr="127.0.0.1", master_port=port, python=python_of(ctx), env=env)]


def plan_cluster(nodes: Sequence[Context], head: str, *, gpus: int | None = None,
                 port: int = DEFAULT_PORT) -> list[NodeLaunch]:
    """Every node's GPUs in one group. The head runs ranks 0.. and the rendezvous, on its address on
    the cluster network (where every node's NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME point)."""
    ordered = sorted(nodes, key=lambda ctx: ctx.host != head)  # the head first: rank 0 is its
    if not ordered or ordered[0].host != head:
        raise ProvisionError(f"the head {head} has no facts: it cannot hold the rendezvous")
    link = ordered[0].link
    if link is None:
        raise ProvisionError(f"{head}: no interface on the cluster network (see `{hints.command('check')}`)")
    counts = [_gpus_of(ctx, gpus) for ctx in ordered]
    world = sum(counts)
    launches = []
    for node_rank, (ctx, nproc) in enumerate(zip(ordered, counts)):
        try:
            env = {**service_env(ctx), **DEBUG_ENV}
        except RenderError as exc:
            raise ProvisionError(str(exc)) from exc
        launches.append(NodeLaunch(host=ctx.host, node_rank=node_rank, nnodes=len(ordered), nproc=nproc,
                                   rank_offset=sum(counts[:node_rank]), world_size=world,
                                   master_addr=link.address, master_port=port, python=python_of(ctx),
                                   env=env))
    return launches


# ---------------------------------------------------------------------------------------------
# Running (the only I/O here, through a Runner) and the summary


def program(spec: Mapping[str, Any]) -> str:
    """host/nccl.py with the call that runs it: the whole stdin of one node's remote execution."""
    return programs.ship(("nccl",), "main", spec)


def run_node(runner: Runner, launch: NodeLaunch, spec: Mapping[str, Any]) -> NodeAnswer:
    """One node's ranks, in one remote execution. A python that is missing is a clear failure."""
    result = runner.run([launch.python, "-"], stdin=program(spec), timeout=float(spec["timeout"]) + 60)
    if result.exited == 127:
        raise ProvisionError(f"{launch.host}: {launch.python} is not installed")
    if not result.ok:
        raise CommandFailed(launch.host, "the all-reduce test", result)
    return parse_answer(launch.host, result.stdout)


@dataclass(frozen=True)
class NcclRun:
    """One test's outcome: `invoke verify.nccl --json` prints `as_json()` per host or cluster."""

    name: str
    hosts: tuple[str, ...]
    world_size: int
    gpus_per_node: tuple[int, ...]
    devices: tuple[str, ...]
    torch: str | None
    nccl: str | None
    log: NcclLog
    rows: tuple[Bandwidth, ...]
    environment: Mapping[str, Mapping[str, str]]  # per host: the NCCL/GLOO/TP/MASTER variables used
    pythons: Mapping[str, str] = field(default_factory=dict)  # per host: the python that ran the ranks
    timing: str | None = None  # "cuda-events" (NCCL), "wall-clock" (gloo); None from a program before it
    reads: Mapping[str, tuple[EnvironmentRead, ...]] = field(default_factory=dict)  # per host, from its log

    @property
    def findings(self) -> tuple[str, ...]:
        """Each rendered NCCL variable that NCCL did not run with, per host."""
        return tuple(f"{host}: {read.finding}" for host, reads in self.reads.items() for read in reads
                     if read.finding)

    @property
    def late(self) -> tuple[Bandwidth, ...]:
        """The sizes whose time has the host's pace in it (see the module's docstring)."""
        return tuple(row for row in self.rows if row.late)

    @property
    def wrong(self) -> int:
        return sum(row.wrong for row in self.rows)

    @property
    def peak_busbw_gbs(self) -> float:
        return max((row.busbw_gbs for row in self.rows), default=0.0)

    def as_json(self) -> dict[str, Any]:
        return {
            "hosts": list(self.hosts), "world_size": self.world_size, "gpus_per_node": list(self.gpus_per_node),
            "devices": list(self.devices), "torch": self.torch, "nccl": self.nccl,
            "transport": describe_transport(self.log), "transports": self.log.transports,
            "paths": list(self.log.paths), "network": self.log.network,
            "nccl_environment": dict(self.log.environment), "nccl_warnings": list(self.log.warnings),
            "nccl_reads": {host: {read.name: {"rendered": read.rendered, "read": read.read, "verdict": read.verdict}
                                  for read in reads} for host, reads in self.reads.items()},
            "findings": list(self.findings),
            "environment": {host: dict(env) for host, env in self.environment.items()},
            "python": dict(self.pythons), "nvls_channels": self.log.nvls_channels,
            "nvlink_gbs": self.log.nvlink_gbs, "nvswitch": self.log.nvswitch,
            "results": [{"bytes": r.bytes, "count": r.count, "type": "float", "redop": "sum",
                         "time_us": r.time_us, "algbw_gbs": r.algbw_gbs, "busbw_gbs": r.busbw_gbs,
                         "wrong": r.wrong, **({"late": True} if r.late else {})} for r in self.rows],
            "peak_busbw_gbs": self.peak_busbw_gbs,
            **({"timing": self.timing} if self.timing else {}),
        }


_SHOWN_ENV = re.compile(r"^(NCCL_|GLOO_|TP_SOCKET|MASTER_|CUDA_VISIBLE|PYTORCH_)")


def summarize(name: str, launches: Sequence[NodeLaunch], answers: Sequence[NodeAnswer]) -> NcclRun:
    """The answers of every node of one test as one result; a failed rank raises with its log's tail."""
    failed = [f"{answer.host} rank {rank.rank}: "
              + ("timed out" if rank.timed_out else f"exit {rank.exit}") + f": {rank.tail()}"
              for answer in answers for rank in answer.ranks if not rank.ok]
    if failed:
        raise ProvisionError(f"{name}: the all-reduce test failed: " + "; ".join(failed))
    head = next((answer for answer in answers if answer.node_rank == 0), None)
    if head is None or head.result is None:
        raise ProvisionError(f"{name}: rank 0 gave no result")
    result = head.result
    world = int(result["world_size"])
    rows = tuple(bandwidth(int(row["bytes"]), int(row["count"]), float(row["seconds"]), world,
                           int(row["wrong"]), bool(row.get("late", False))) for row in result["rows"])
    log = _ranks_log(answers)
    reads = {launch.host: environment_reads(launch.env, _ranks_log(answers, launch.host)) for launch in launches}
    shown = {launch.host: dict(sorted({**{key: value for key, value in launch.env.items()
                                            if _SHOWN_ENV.match(key)},
                                         "MASTER_ADDR": launch.master_addr,
                                         "MASTER_PORT": str(launch.master_port)}.items()))
             for launch in launches}
    return NcclRun(name=name, hosts=tuple(launch.host for launch in launches), world_size=world,
                   gpus_per_node=tuple(launch.nproc for launch in launches),
                   devices=tuple(rank.device or "?" for answer in answers for rank in answer.ranks),
                   torch=result.get("torch"),
                   nccl=result.get("nccl") or log.version, log=log, rows=rows,
                   environment=shown, pythons={launch.host: launch.python for launch in launches},
                   timing=result.get("timing"), reads=reads)


def _ranks_log(answers: Sequence[NodeAnswer], host: str | None = None) -> NcclLog:
    """The ranks' NCCL log, of every node or of one (each node reads its own environment). Where NCCL
    logged nothing, an empty log that says so: the figures still stand, only the transport is unknown."""
    try:
        return parse_nccl_log("\n".join(rank.log for answer in answers if host is None or answer.host == host
                                         for rank in answer.ranks))
    except ParseError:
        return NcclLog(version=None, links=(), paths=(), network=None, environment={}, nranks=None,
                       nnodes=None, warnings=("no NCCL INFO line in the ranks' logs",))


def verify(inv: Inventory, targets: list[Host], options: Options, cluster: str | None, sizes: list[int],
           asked: NcclFlags) -> tuple[list[str], dict[str, NcclRun], dict[str, BaseException]]:
    """One test per named host, or one for the cluster (across its nodes when it has several), every node
    of every test at once, each message size of `sizes` as `asked`; returns the tests in order, their
    results and what failed."""
    iters, warmup, timeout, gpus, port = asked.iters, asked.warmup, asked.timeout, asked.gpus, asked.port
    log_dir = Path(asked.log_dir) if asked.log_dir else None
    from provision import (
        run as pipeline,  # the pipeline builds the contexts; it does not need this module
    )

    gated = pipeline.gate(inv, targets, options)
    errors, contexts = gated.errors, gated.contexts

    # One test per named host, or one for the cluster (across nodes when it has several).
    plans: dict[str, list[NodeLaunch]] = {}
    failures: dict[str, BaseException] = {}
    tests = [(cluster, list(inv.cluster(cluster).hosts))] if cluster else [(t.name, [t.name]) for t in targets]
    for name, members in tests:
        missing = [member for member in members if member not in contexts]
        if missing:
            failures[name] = errors.get(missing[0]) or ProvisionError(f"{missing[0]}: no facts")
            continue
        try:
            if len(members) == 1:
                plans[name] = plan_host(contexts[members[0]], gpus=gpus or None, port=port, cluster=cluster)
            else:
                head = inv.cluster(name).head
                plans[name] = plan_cluster([contexts[m] for m in members], head, gpus=gpus or None, port=port)
        except ProvisionError as exc:
            failures[name] = exc

    # Every node of every test at once: a multi-node group only forms when all its nodes run.
    launches = [(name, launch) for name, node_launches in plans.items() for launch in node_launches]

    def one_node(item: tuple[str, NodeLaunch]) -> NodeAnswer:
        _, launch = item
        runner = remote.connect(inv.host(launch.host), inv.ssh, accept_new_host_keys=options.accept_new_host_keys)
        try:
            return run_node(runner, launch, launch.spec(sizes, iters, warmup, timeout))
        finally:
            runner.close()

    answers = for_each_host(launches, lambda item: f"{item[0]}/{item[1].host}", one_node)
    if log_dir:
        folder = log_dir
        folder.mkdir(parents=True, exist_ok=True)
        for key, answer in answers.values.items():
            (folder / f"{key.replace('/', '-')}.json").write_text(answer.raw, encoding="utf-8")
    runs: dict[str, NcclRun] = {}
    for name, node_launches in plans.items():
        keys = [f"{name}/{launch.host}" for launch in node_launches]
        broken = [answers.errors[key] for key in keys if key in answers.errors]
        try:
            if broken:
                raise broken[0]
            runs[name] = summarize(name, node_launches, [answers.values[key] for key in keys])
        except ProvisionError as exc:
            failures[name] = exc
        except Exception as exc:  # noqa: BLE001 - reported per test (as an internal error), never lost
            failures[name] = exc
    return [name for name, _ in tests], runs, failures
