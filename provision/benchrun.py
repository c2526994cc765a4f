"""`bench --profile FILE`: a published benchmark profile (provision/benchprofile.py) run against one host's
server with llama-benchy, from this machine, as sparkrun runs Spark Arena's profiles.

The server is reached through the host's SSH connection (remote.forwarded): it need not listen beyond
loopback for a benchmark. llama-benchy counts tokens with the model's own tokenizer, fetched from the
host's model directory (else it looks the model's name up on the hub). Each run is one llama-benchy
process whose JSON result is kept verbatim; the runs go into one document with the profile, the cut,
the tool's version and what was measured. The API key reaches llama-benchy through its environment
(provision/benchlaunch.py), never argv.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from provision import __version__, benchprofile, endpoints, remote, render, server
from provision.benchlaunch import KEY_VARIABLE
from provision.benchprofile import Profile, Run, Target
from provision.errors import BenchProfileError
from provision.inventory import Inventory, Settings, applied_dir_of
from provision.runner import Runner

# Seconds one pass of a run may take: llama-benchy's warm-up, then each of its repetitions (the
# profile's `runs`), at one depth and concurrency; a run's limit is this times its passes.
PASS_TIMEOUT = 900.0


def tool_version() -> str:
    """llama-benchy's version here; BenchProfileError (exit 2) where it is not installed."""
    try:
        return metadata.version("llama-benchy")
    except metadata.PackageNotFoundError:
        raise BenchProfileError("llama-benchy is not installed here (the bench extra: pip install "
                                "'provision[bench]')", file="command line", key="--profile") from None


@dataclass(frozen=True)
class Measured:
    """What a profile run kept: the document (written where the task says) and whether every run ended well."""

    document: dict[str, Any]
    ok: bool


@dataclass(frozen=True)
class Served:
    """What a profile measures: where the server answers (ADDRESS:PORT as seen from `runner`'s host: a
    host's own server, or an endpoint's router), the model's hub name and the name it is served as,
    the context it holds, and a host that keeps the model's files (`files`, its settings) for the
    tokenizer; `what`: how the results name it."""

    runner: Runner
    address: str
    port: int
    served_name: str
    files: Runner
    settings: Settings
    what: str


def served_by(runner: Runner, settings: Settings) -> Served:
    """A host's own server."""
    return Served(runner, server.local_address(settings), settings.port, server.served_name(settings), runner,
                  settings, f"host {runner.host}")


def run_profile(served: Served, api_key: str | None, profile: Profile, work: Path, book_url: str | None,
                progress: Callable[[str], None]) -> Measured:
    """Every run of the profile that the server's context holds, one after the other; a run that fails
    is recorded (its exit and its output's end) and the others still run."""
    version = tool_version()
    settings = served.settings
    runs, cut = benchprofile.cut(profile.runs, settings.max_model_len)
    if not runs:
        raise BenchProfileError(f"no run of the profile fits the server: {cut.words() if cut else ''}",
                                file=profile.source)
    if cut is not None and cut.cut:
        progress(f"profile {profile.name}: {cut.words()}")
    tokenizer = fetch_tokenizer(served.files, settings, work)
    if tokenizer is None:
        progress(f"no tokenizer.json in {render.model_path(settings)} on {served.files.host}: llama-benchy looks "
                 f"{settings.model} up by name")
    results = []
    with remote.forwarded(served.runner, served.address, served.port) as (address, port):
        target = Target(server.server_url(address, port) + "/v1", str(settings.model), served.served_name,
                        str(tokenizer) if tokenizer else None, book_url)
        for number, run in enumerate(runs, 1):
            progress(f"[{number}/{len(runs)}] {run.label}: pp {run.args.get('pp')} tg {run.args.get('tg')}, "
                     f"{run.repetitions} repetition(s) ...")
            results.append(_one(run, target, api_key, work / f"run-{number:02d}"))
    document = {
        "profile": {"name": profile.name, "description": profile.about, "source": profile.source,
                    "published": profile.published.as_json() if profile.published else None,
                    "framework": benchprofile.FRAMEWORK, "args": dict(profile.args),
                    "repetitions": profile.repetitions,
                    "changed_by_command_line": dict(profile.changed)},
        "cut": cut.words() if cut is not None and cut.cut else None,
        "tool": {"name": benchprofile.FRAMEWORK, "version": version},
        "measured_with": f"provision {__version__}", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "measured": served.what, "host": served.runner.host, "engine": settings.engine, "model": settings.model,
        "served_model_name": served.served_name, "runs": results, "consolidated": consolidated(results)}
    return Measured(document, all(item["exit"] == 0 and item["result"] for item in results))


def consolidated(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The runs as one llama-benchy document, the shape sparkrun consolidates a profile's runs into and
    uploads to Spark Arena's leaderboard: the first run's model, the highest concurrency measured, every
    run's benchmark rows in the schedule's order; runs that failed are left out."""
    model, highest, rows = "", 0, []
    for item in results:
        result = item.get("result")
        if item.get("exit") != 0 or not isinstance(result, dict):
            continue
        model = model or str(result.get("model", ""))
        for row in result.get("benchmarks") or []:
            rows.append(row)
            highest = max(highest, int(row.get("concurrency") or 0))
    return {"model": model, "max_concurrency": highest, "benchmarks": rows}


def _one(run: Run, target: Target, api_key: str | None, stem: Path) -> dict[str, Any]:
    result_file, log_file = stem.with_suffix(".json"), stem.with_suffix(".log")
    env = {**os.environ, **({KEY_VARIABLE: api_key} if api_key else {})}
    started = time.monotonic()
    with log_file.open("w") as log:
        try:
            done = subprocess.run([sys.executable, "-m", "provision.benchlaunch",
                                   *benchprofile.argv(run, target, str(result_file))],
                                  stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                  timeout=PASS_TIMEOUT * (run.repetitions + 1), check=False)
            code = done.returncode
        except subprocess.TimeoutExpired:
            code = 124
    result: Any = None
    if result_file.is_file():
        try:
            result = json.loads(result_file.read_text(encoding="utf-8"))
        except ValueError:
            result = None
    tail = log_file.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-5:]
    return {"label": run.label, "depth": run.depth, "concurrency": run.concurrency, "args": dict(run.args),
            "exit": code, "seconds": round(time.monotonic() - started, 1), "result": result,
            "output_tail": None if code == 0 and result else tail}


def kept_path(inv: Inventory, host: str | None, endpoint: str | None, profile: str) -> Path:
    """Where bench --profile keeps its results by default: beside the recipe applied to the host's
    cluster (applied/CLUSTER-PROFILE-TIME.json), else bench/HOST-PROFILE-TIME.json (an endpoint's:
    bench/endpoint-NAME-PROFILE-TIME.json) beside the inventory."""
    base = Path(inv.path) if inv.path else Path.cwd()
    folder = base if base.is_dir() else base.parent
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if endpoint is not None:
        return folder / "bench" / f"endpoint-{endpoint}-{profile}-{stamp}.json"
    cluster = inv.cluster_of(host or "")
    if cluster is not None and cluster.name in inv.applied:
        return applied_dir_of(base) / f"{cluster.name}-{profile}-{stamp}.json"
    return folder / "bench" / f"{host}-{profile}-{stamp}.json"


@contextmanager
def connected(inv: Inventory, host: str | None, endpoint: str | None, overrides: Mapping[str, Any],
              model: str | None = None) -> Iterator[Served]:
    """What a profile measures, its connections closed after: a host's own server; or an endpoint's
    router (reached on its host) serving `model` (None: its first), whose files come from that model's
    first replica's host."""
    if endpoint is None:
        runner = remote.connect(inv.host(host or ""), inv.ssh)
        try:
            yield served_by(runner, inv.settings(host or "", overrides))
        finally:
            runner.close()
        return
    plan = endpoints.named(inv, endpoint)
    backend = plan.backend_for(model)
    replica = backend.replicas[0]
    router = remote.connect(inv.host(plan.host), inv.ssh)
    files = remote.connect(inv.host(replica.host), inv.ssh)
    try:
        yield Served(router, plan.local_address, plan.port, backend.model, files, inv.settings(replica.host, overrides),
                     f"endpoint {endpoint} ({backend.model}: {len(backend.replicas)} replica(s), through its router "
                     f"on {plan.host})")
    finally:
        files.close()
        router.close()


def keep(path: Path, document: Mapping[str, Any]) -> None:
    """The results, as a new file (never over one)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("x", encoding="utf-8") as stream:
            stream.write(json.dumps(document, indent=1) + "\n")
    except FileExistsError:
        raise BenchProfileError("exists already: never overwritten (name another file)", file=str(path)) from None
    except OSError as exc:
        raise BenchProfileError(f"cannot write: {exc.strerror or exc}", file=str(path)) from exc


def fetch_tokenizer(runner: Runner, settings: Settings, work: Path) -> Path | None:
    """The model's tokenizer.json from its directory on the host, here; None where it has none."""
    remote_path = f"{render.model_path(settings)}/tokenizer.json"
    if not runner.run(["test", "-f", remote_path]).ok:
        return None
    local = work / "tokenizer.json"
    runner.get(remote_path, local)
    return local


def unmeasured_decode(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """Pure: why a run has no decode speed, for the runs that have none (None when every run has one).
    llama-benchy times decoding between the streamed chunks of an answer; an answer of one token, or
    one that arrives in one chunk, has no such time (a server behind on its streaming sends all it has
    generated at once: vLLM did for the lab's tiny model on a loaded CPU)."""
    missing = [row["label"] for row in rows if row["exit"] == 0 and row["tg_tokens_per_s"] is None]
    if not missing:
        return None
    return (f"decode tok/s not measured for {', '.join(missing)}: each answer arrived in one streamed chunk "
            "(or was one token), and llama-benchy times decoding between chunks")


def rows_of(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per run: its label, the prompt and output sizes, llama-benchy's mean prefill and
    generation tokens/s and time to first token (ms) across its phases; None where it gave none."""
    rows = []
    for item in document.get("runs", []):
        benchmarks = (item.get("result") or {}).get("benchmarks") or []

        def mean(metric: str, runs: list[dict[str, Any]] = benchmarks) -> float | None:
            values = [run[metric]["mean"] for run in runs if isinstance(run.get(metric), dict)]
            return round(sum(values) / len(values), 2) if values else None

        rows.append({"label": item["label"], "pp": item["args"].get("pp"), "tg": item["args"].get("tg"),
                     "exit": item["exit"], "pp_tokens_per_s": mean("pp_throughput"),
                     "tg_tokens_per_s": mean("tg_throughput"), "ttft_ms": mean("e2e_ttft"),
                     "seconds": item["seconds"]})
    return rows
